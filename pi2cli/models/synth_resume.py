"""Resuming an interrupted `pi2 models synth`: a checkpoint after every layer.

A full-size synthesis runs for many minutes and writes tens of GB; a Ctrl-C, a kill or a reboot
should cost one layer, not the run. Both writers write at final offsets (the .pi2's FFN blocks and
resident tensors, the GGUF twin's tensors by pwrite), so a run can reopen their temp files
(`.model.pi2.partial`, `.model.gguf.partial`) and go on. After each layer the files are fsynced, then
`.synth-state.pkl` records what is durable: the .pi2 writer's tensor table, CRCs and positions, the
twin's next tensor, the residual stream of the calibration/held-out rows and the per-layer statistics.
A state whose fingerprint (options, shapes, generator version) differs from this run's is ignored
and the run starts over.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path

from pi2cli.models.pi2file import Pi2Writer

STATE_NAME = ".synth-state.pkl"
GENERATOR_VERSION = 2  # bump when the bytes a seed produces change


def fingerprint(cfg_fields: dict, dims: dict) -> str:
    blob = json.dumps({"cfg": cfg_fields, "dims": dims, "v": GENERATOR_VERSION}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class ResumablePi2Writer(Pi2Writer):
    """A Pi2Writer with a fixed temp name that can snapshot its progress and reopen it."""

    def __init__(self, path, header, tokenizer_blob=b"", metadata=None, resume_state: dict | None = None):
        super().__init__(path, header, tokenizer_blob=tokenizer_blob, metadata=metadata)
        # the parent opened a pid-named temp file; use the fixed name instead so a rerun finds it
        os.close(self._fd)
        self._tmp.unlink(missing_ok=True)
        self._tmp = self.path.with_name(f".{self.path.name}.partial")
        if resume_state is not None:
            self._fd = os.open(self._tmp, os.O_WRONLY)
            for key, value in resume_state.items():
                setattr(self, key, value)
        else:
            self._fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def snapshot(self) -> dict:
        os.fsync(self._fd)
        return {
            "entries": list(self.entries),
            "_names": set(self._names),
            "_resident_pos": self._resident_pos,
            "_crc": dict(self._crc),
            "_ffn_done": self._ffn_done,
        }

    def detach(self) -> None:
        """Close without removing the temp file."""
        if not self._closed:
            self._closed = True
            os.close(self._fd)


def load(out_dir: Path, fp: str) -> dict | None:
    """The checkpoint in out_dir if it belongs to this run (same fingerprint) and its files exist."""
    path = Path(out_dir) / STATE_NAME
    try:
        with open(path, "rb") as f:
            state = pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        return None
    if not isinstance(state, dict) or state.get("fingerprint") != fp:
        return None
    out_dir = Path(out_dir)
    need = [out_dir / ".model.gguf.partial"] + ([out_dir / ".model.pi2.partial"] if state.get("pi2") else [])
    return state if all(p.exists() for p in need) else None


def save(out_dir: Path, state: dict) -> None:
    path = Path(out_dir) / STATE_NAME
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def clear(out_dir: Path) -> None:
    (Path(out_dir) / STATE_NAME).unlink(missing_ok=True)
    (Path(out_dir) / (STATE_NAME[:-4] + ".tmp")).unlink(missing_ok=True)
