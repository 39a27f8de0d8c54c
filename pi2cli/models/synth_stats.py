"""The statistics `pi2 models synth` measures for each layer: written into the model's metadata by the
generator (synth.py) and kept across an interruption in its checkpoint (synth_resume.py), so both
import them from here and neither from the other."""

from dataclasses import dataclass, field


@dataclass
class LayerStats:
    layer: int
    target_sparsity: float
    sparsity: float
    hot_coverage: float
    recall: float
    precision: float
    predicted_fraction: float
    threshold: float
    per_expert: list[dict] = field(default_factory=list)
