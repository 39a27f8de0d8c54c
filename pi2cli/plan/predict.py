"""Predicted decode speed of the sparse engine for a model, a memory budget and a device profile.

`pi2 plan` sizes the engine's regions; this module turns the same facts into a tokens-per-second
PREDICTION by counting the bytes one decode step really reads and where they come from:

  memory side (at the profile's read bandwidth):
    attention weights of every layer (q, k, v, o), the KV cache up to the position, the router, the
    output matrix, one embedding row; the predictors of the ROUTED experts only (top-k of n, not all
    resident ones); per routed FFN block the predicted neurons' gate rows and, for those whose gate
    fires (predicted x precision), their up rows and down columns. No dense down copy: the sparse path
    reads the bundles' down columns.
  storage side: the predicted neurons that miss the neuron cache, read whole or in two phases (gate
    part, then the rest where the gate fires) as the engine decides at open; reads per token count both
    phases. A whole-bundle miss is timed from the profile's waves (a block's misses go out as one sorted
    wave within its span, wave_read_time), a gate or rest read, or any read where the profile has no
    waves, from the random-read curve at its size and the queue depth the wave keeps (read_time_at).

The cache and its hot/cold split are the engine's own (`pi2-engine size --facts` at the run's context);
in steady state it keeps the hot set and the cold neurons ranked just after it (the admit limit), so the
hit rate is the share of the NAMED neurons (what the predictor names, false positives included) on that
many of the hottest ranks. Measured where a run of the model gave its `named` event (named_profile: the
decode steps' named neurons by hotness rank, and how many a routed block names a step); otherwise the
coverage curve of the synthetic design's lognormal activation frequencies at the model's sparsity, which
misses the false positives further down the ranks (1.15-1.4x the reads where the cache holds little of
the FFN: docs/PLAN.md).
Storage time and compute time add, less one overlap. powerinfer2's pipeline overlaps a block's reads
only with that block's cached neurons (their gate and up rows): the misses' rows and the down pass wait
for the block's last read, and attention, the router and the predictors run between blocks with nothing
in flight (the lookahead aside). The other policies read a block's wave whole before computing it, so
their times add. Where compute is fast against the disk (the AMD Zen 4 VMs: per-token regressions of
decode time on reads, the 7B shape at 2.68 GiB 75 ms + 15 us a read) the overlap is small; where it is
slow (the Intel VMs, 7-8 tok/s in memory) the cached neurons' rows take as long as a block's reads at
15 GiB on the 47B, and the plain sum put that point 20% slow (docs/PLAN.md).
Nothing here is fitted to the paper's results; the constants are named where they are used.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from pi2cli.builds.capabilities import engine_default
from pi2cli.errors import Pi2Error
from pi2cli.plan.calibrate import applies
from pi2cli.plan.facts import ModelFacts, engine_sizing, predicted_fraction, read_align, round_up

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
DECODE_POSITION = 512  # KV positions read per token in the prediction (a mid-conversation turn)


def queue_depth() -> int:
    """Reads the engine keeps in flight (its default, `capabilities --json`)."""
    return int(engine_default("queue_depth"))


def default_ctx() -> int:
    """The KV cache pi2-engine chat (and so pi2 bench) takes without --ctx (its default)."""
    return int(engine_default("ctx"))


# -------------------------------------------------------------------------------------- storage model
def read_time_s(curve: list[dict], size: int) -> float:
    """Seconds of device time one random read of `size` bytes costs at the profile's queue depth:
    1/IOPS interpolated linearly in size between the measured block sizes (a fixed cost per request plus
    a cost per byte; extrapolated from the nearest two points outside them), never less than the bytes
    at the best bandwidth measured. Sizes are rounded up to the engine's direct-read unit, as its reads are."""
    size = round_up(max(1, int(size)), read_align())
    pts = sorted((int(p["block"]), 1.0 / float(p["iops"])) for p in curve)
    best_bw = max(float(p["mb_per_s"]) for p in curve) * 1e6
    if len(pts) == 1:
        b, t = pts[0]
        lin = t * max(1.0, size / b)  # one point: request-bound below it, bandwidth-bound above
    else:
        i = 0
        while i < len(pts) - 2 and size > pts[i + 1][0]:
            i += 1
        (b0, t0), (b1, t1) = pts[i], pts[i + 1]
        lin = t0 + (t1 - t0) * (size - b0) / (b1 - b0)
    return max(lin, size / best_bw)


def curve_anomalies(curve: list[dict]) -> str:
    """What breaks the shape any storage has (larger reads: no more IOPS, no less bandwidth), beyond 15%."""
    pts = sorted(curve, key=lambda p: p["block"])
    out = []
    for a, b in zip(pts, pts[1:], strict=False):
        if b["iops"] > 1.15 * a["iops"]:
            out.append(f"{b['block'] // 1024} KiB reads got more IOPS than {a['block'] // 1024} KiB")
        if b["mb_per_s"] < a["mb_per_s"] / 1.15:
            out.append(f"{b['block'] // 1024} KiB reads got less bandwidth than {a['block'] // 1024} KiB")
    return "; ".join(out)


# ------------------------------------------------------------------------------------------ devices
@dataclass
class Device:
    """What the prediction needs from a device: read bandwidth, the storage curve, compute threads."""

    name: str
    membw_bytes_per_s: float
    curve: list[dict]  # [{"block", "qd", "iops", "mb_per_s"}], as pi2 profile measures it
    threads: int
    source: str  # the profile file, or "pi2 profile" (measured)
    deep: list[dict] = field(default_factory=list)  # the curve at the engine's queue depth, when measured
    waves: list[dict] = field(default_factory=list)  # reads in sorted waves within one span (storage.waves)
    decode: dict | None = None  # the engine's decode calibration on one model (pi2cli.plan.calibrate)


def shipped_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.toml"))


def load_device(name_or_path: str | Path) -> Device:
    """A shipped profile by name (pi2cli/plan/profiles/NAME.toml), a TOML file, or a `pi2 profile` JSON."""
    path = Path(name_or_path)
    if not path.exists() and (PROFILES_DIR / f"{name_or_path}.toml").is_file():
        path = PROFILES_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        raise Pi2Error(f"--profile {name_or_path}: no such file or shipped profile "
                       f"(shipped: {', '.join(shipped_profiles())})")  # fmt: skip
    if path.suffix == ".toml":
        return device_from_toml(path)
    from pi2cli.plan.profile import read_json_file

    return device_from_probe(read_json_file(path, "--profile"), str(path))


def device_from_toml(path: Path) -> Device:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise Pi2Error(f"--profile {path}: {exc}") from None
    try:
        mem = data["memory"]
        bw = float(mem["theoretical_gb_per_s"]) * float(mem["cpu_read_efficiency"]) * 1e9
        curve = [{"block": int(p["block"]), "qd": int(p.get("qd", 32)), "mb_per_s": float(p["mb_per_s"]),
                  "iops": float(p["mb_per_s"]) * 1e6 / int(p["block"])} for p in data["storage"]["random_read"]]  # fmt: skip
        threads = int(data["compute"]["threads"])
    except (KeyError, TypeError, ValueError) as exc:
        raise Pi2Error(f"--profile {path}: missing or bad field {exc}") from None
    return Device(data.get("name", path.stem), bw, curve, threads, str(path))


def device_from_probe(profile: dict, source: str = "pi2 profile", threads: int | None = None) -> Device:
    """This machine (or a phone) as `pi2 profile` measured it: the read bandwidth with `threads` compute
    threads (default: those `pi2 plan` gives it, every core; on cores of different speeds the big and mid
    ones less the I/O core), the curve."""
    from pi2cli.plan.profile import default_compute_threads, pick_membw, validate_profile

    validate_profile(profile)
    threads = (
        threads
        or default_compute_threads(profile["cores"].get("clusters") or [])
        or int(profile["cores"]["count"])
    )
    name = str(profile.get("target", {}).get("name", "measured"))
    deep = [
        p for p in profile["storage"].get("deep") or [] if p.get("iops", 0) > 0 and p.get("mb_per_s", 0) > 0
    ]
    waves = [
        p for p in profile["storage"].get("waves") or [] if p.get("iops", 0) > 0 and p.get("wave", 0) > 0
    ]
    decode = profile.get("decode")
    decode = decode if isinstance(decode, dict) and float(decode.get("compute_s") or 0) > 0 else None
    return Device(
        name, pick_membw(profile, threads), profile["storage"]["curve"], threads, source, deep, waves, decode
    )


# ------------------------------------------------------------------------------------------- models
def facts_from_registry(name: str, quant: str = "q4_0") -> ModelFacts:
    """ModelFacts for a registry model WITHOUT its file: the .pi2 `models synth --like NAME` writes
    (same shapes, predictors, bundle layout; synth.planned_sizes), with the design's statistics."""
    from pi2cli.models import gguf_twin, synth
    from pi2cli.models.registry import get_model

    spec = get_model(name)
    cfg = synth.default_config(spec.name)
    cfg.quant = quant
    full = synth.synth_spec(cfg, spec.vocab)
    full = type(full)(**{**full.__dict__, "name": spec.name})
    rank = synth.default_predictor_rank(full)
    header = synth._pi2_header(cfg, full)
    sizes = synth.planned_sizes(cfg, full, rank)
    resident = sizes["model.pi2"] - 4096 - header.neuron_region_bytes
    sparsity = spec.published_sparsity or 0.9
    # the synthetic design's figures (docs/MODELS.md "Measured"): recall 0.95 by construction,
    # precision ~0.5 at these predictor ranks
    precision = 0.5
    measured = {"sparsity": sparsity, "precision": precision, "recall": 0.95,
                "predicted_fraction": min(1.0, (1 - sparsity) * 0.95 / precision)}  # fmt: skip
    return ModelFacts(
        name=spec.name, arch="moe" if spec.is_moe else "llama", ffn_act=spec.activation if spec.activation != "silu" else "swiglu",
        neuron_type=quant.upper(), n_layer=full.n_layer, n_embd=full.hidden, n_ff=full.ffn, n_head=full.n_head,
        n_head_kv=full.n_kv_head, head_dim=full.head_dim, n_vocab=full.vocab, has_predictor=True,
        part_bytes=gguf_twin.row_bytes(quant, full.hidden), bundle_stride=header.bundle_stride,
        resident_bytes=resident, per_token_resident_bytes=resident, other_bytes=0,
        n_expert=full.n_expert, n_expert_used=full.n_expert_used, dense_down=header.dense_down,
        measured=measured, profiled_hot_fraction=None, synthetic=True,
    )  # fmt: skip


@lru_cache(maxsize=8)
def _design_coverage_curve(sparsity: float) -> tuple:
    """Cumulative share of activations on the hottest x of neurons, for the synthetic design's
    lognormal(sigma 2.1, capped 0.8) frequencies at this sparsity (pi2cli.models.synth)."""
    import numpy as np

    from pi2cli.models.synth import frequency_targets

    p = np.sort(frequency_targets(np.random.default_rng(0), 1 << 16, 1.0 - sparsity))[::-1]
    cum = np.concatenate([[0.0], np.cumsum(p) / p.sum()])
    return tuple(cum[:: 1 << 8])  # 257 points, x = 0, 1/256, ..., 1


def named_profile(event: dict, m: ModelFacts) -> dict:
    """What a run's `named` event says about the model (docs/SPARSE.md): the cumulative share of the
    named neurons on the hottest x of a block's ranks (x = 0, 1/bins, ..., 1), and how many neurons a
    routed block names a decode step. Goes into ModelFacts.measured["named"]."""
    by_rank, steps = [int(c) for c in event.get("by_rank") or []], int(event.get("decode_steps") or 0)
    total = sum(by_rank)
    if not total or not steps:
        raise Pi2Error("the run's `named` event counted no decode step: generate at least 2 tokens")
    cum, acc = [0.0], 0
    for c in by_rank:
        acc += c
        cum.append(acc / total)
    return {"curve": cum, "per_block": total / (steps * m.blocks_per_token), "decode_steps": steps}


def coverage(m: ModelFacts, frac: float) -> float:
    """Share of the named neurons on the hottest `frac` of a block's ranks: measured (named_profile), or the
    design's activation curve."""
    frac = min(1.0, max(0.0, frac))
    named = m.measured.get("named")
    curve = (
        named["curve"] if named else _design_coverage_curve(round(float(m.measured.get("sparsity", 0.9)), 3))
    )
    x = frac * (len(curve) - 1)
    i = min(int(x), len(curve) - 2)
    return float(curve[i] + (curve[i + 1] - curve[i]) * (x - i))  # a Python float: it ends up in JSON


# --------------------------------------------------------------------------------------- prediction
def per_token_memory_bytes(m: ModelFacts, pred_bytes_per_block: int, position: int) -> dict:
    """Bytes one decode step reads from memory, by part (FFN bundles counted separately)."""
    from pi2cli.models.gguf_twin import row_bytes

    q = m.neuron_type.lower()
    E, hd = m.n_embd, m.head_dim
    attn = m.n_layer * (
        (m.n_head * hd + 2 * m.n_head_kv * hd) * row_bytes(q, E) + E * row_bytes(q, m.n_head * hd)
    )
    kv = 2 * m.n_layer * position * m.n_head_kv * hd * 2
    routed = m.n_expert_used if m.arch == "moe" else 1
    return {
        "attention": attn,
        "kv_cache": kv,
        "router": m.n_layer * m.n_expert * E * 4,
        "predictors": m.n_layer * routed * pred_bytes_per_block,
        "output": m.n_vocab * row_bytes(q, E) + row_bytes(q, E),
    }


def read_time_at(device: Device, size: int, qd: float) -> float:
    """Device seconds per random read of `size` bytes with `qd` reads in flight: the profile's curve at
    QD 32, and where the profile measured the engine's queue depth too (`storage.deep`, QD 512), log-linear
    in the queue depth between the two (a wave of n misses keeps min(n, 512) in flight). Below QD 32 the
    QD 32 figure is kept: a short wave pays its latency once, which the per-read cost already covers."""
    t32 = read_time_s(device.curve, size)
    if not device.deep or qd <= 32:
        return t32
    deep_qd = max(33, int(device.deep[0].get("qd", queue_depth())))
    t_deep = read_time_s(device.deep, size)
    w = min(1.0, math.log(qd / 32) / math.log(deep_qd / 32))
    return t32 + (t_deep - t32) * w


def wave_read_time(device: Device, m: ModelFacts, size: int, n: float) -> float:
    """Device seconds per read of `size` bytes when a block's wave holds n of its n_ff neurons' reads:
    from the profile's waves (storage.waves: sorted reads within one span, collected whole, as decode
    issues them) at the same share of the span's blocks, log-linear in the wave size between the points
    measured (held flat past them), scaled from the waves' block size to `size` as the QD 32 curve
    scales. Without waves in the profile: read_time_at at the wave's queue depth."""
    if not device.waves or n <= 0:
        return read_time_at(device, size, min(queue_depth(), n))
    pts = sorted(device.waves, key=lambda p: p["wave"])
    slots = pts[0]["range"] / pts[0]["block"]
    n_eq = min(max(n / m.n_ff * slots, pts[0]["wave"]), pts[-1]["wave"])
    i = next((k for k in range(len(pts) - 1) if n_eq <= pts[k + 1]["wave"]), len(pts) - 2)
    lo, hi = pts[max(i, 0)], pts[min(i + 1, len(pts) - 1)]
    w = 0.0 if hi["wave"] == lo["wave"] else math.log(n_eq / lo["wave"]) / math.log(hi["wave"] / lo["wave"])
    t = 1.0 / (lo["iops"] + (hi["iops"] - lo["iops"]) * w)
    return t * read_time_s(device.curve, size) / read_time_s(device.curve, int(pts[0]["block"]))


def engine_split(m: ModelFacts, budget: int, ctx: int, threads: int, split: dict | None = None) -> dict:
    """The engine's own sizing under `budget` (`pi2-engine size --facts`; split: the plan's hot_fraction,
    hot_share and cluster, else the engine's defaults): cache bytes, hot neurons per block, cold slots,
    whether the whole FFN is resident. A budget the engine refuses leaves no cache (and says why)."""
    size = engine_sizing(m, budget, ctx, threads, **(split or {}))
    if "error" in size:
        return {"fixed": int(size.get("min_budget_bytes") or budget), "cache": 0, "hot": 0, "cold": 0,
                "whole": False, "too_small": size["error"]}  # fmt: skip
    c = size["cache"]
    whole = bool(size.get("whole_model_resident")) or c["cold_slots"] >= m.n_blocks * m.n_ff
    # the slots the engine reserves (hot clusters + cold slots), which is all of the cache's bytes unless
    # the whole FFN fits with room to spare
    return {"fixed": int(size["fixed"]["bytes"]), "cache": int(c["hot_bytes"] + c["cold_bytes"]), "hot": int(c["hot_neurons_per_block"]),
            "cold": int(c["cold_slots"]), "whole": whole}  # fmt: skip


def predict(
    m: ModelFacts,
    device: Device,
    budget: int,
    *,
    policy: str = "powerinfer2",
    pred_bytes_per_block: int | None = None,
    position: int = DECODE_POSITION,
    ctx: int | None = None,
    two_phase: bool | None = None,
    split: dict | None = None,
) -> dict:
    """Predicted decode tok/s and where each millisecond goes (a plain dict: the JSON pi2 plan prints).

    ctx: the KV cache the run reserves (pi2-engine generate: prompt + generated tokens; chat and bench:
    4096): it moves the cache by up to half a GiB. two_phase: the run's setting; None = as the engine
    decides at open (gate read + half a rest read cheaper than one whole read, at the wave's queue depth).
    split: a plan's hot_fraction / hot_share / cluster (None: the engine's defaults). This is the one
    prediction: `pi2 plan` gives it for a plan (make_plan) and for a device profile alone (run_prediction)."""
    ctx = ctx or default_ctx()
    if pred_bytes_per_block is None:
        pred_bytes_per_block = predictor_bytes(m)
    cal = device.decode if applies(device.decode, m.file_bytes, m.n_blocks) else None
    if cal and not m.measured.get("named"):  # the calibration's named curve, where no other was given
        m = replace(m, measured=m.measured | {"named": named_profile(cal["named"], m)})
    sz = engine_split(m, budget, ctx, device.threads, split)
    pf = predicted_fraction(m)
    precision = float(m.measured.get("precision", 0.5))
    blocks = m.blocks_per_token
    named = m.measured.get("named")
    per_block = named["per_block"] if named else pf * m.n_ff  # neurons the predictors name per routed block
    ffn_mem = (
        blocks * per_block * m.part_bytes * (1 + 2 * precision)
    )  # gate rows; up/down where the gate fires

    def memory_bytes(pos: int) -> dict:
        return per_token_memory_bytes(m, pred_bytes_per_block, pos) | {"ffn": ffn_mem}

    mem = memory_bytes(position)
    # The compute side's rate: bytes a decode step gets through a second. The calibration's (its step's
    # time less its wait on reads, over the bytes this count gives its step; at other thread counts
    # scaled as the probe's bandwidth), else the bandwidth probe's.
    rate = device.membw_bytes_per_s
    cal_mem = sum(memory_bytes(int(cal["position"])).values()) if cal else 0.0  # a calibration step's bytes
    if cal:
        rate = cal_mem / float(cal["compute_s"])
        rate *= device.membw_bytes_per_s / float(cal.get("membw_bytes_per_s") or device.membw_bytes_per_s)
    # steady state: the hot set and the cold neurons ranked just after it (the admit limit) stay cached
    frac = 1.0 if sz["whole"] else min(1.0, (sz["hot"] + sz["cold"] / m.n_blocks) / m.n_ff)
    hit = 1.0 if frac >= 1 else coverage(m, frac)
    misses = per_block * (1 - hit)  # per routed block, all issued at once by the block's wave
    t_whole = wave_read_time(device, m, m.full_len, misses)
    t_gate = read_time_at(device, m.gate_len, min(queue_depth(), misses))
    t_rest = read_time_at(device, m.rest_len, min(queue_depth(), misses * precision))
    if not m.two_phase_applies or policy != "powerinfer2":
        two = False
    elif two_phase is None:  # sparse_open.c: 1/gate + 0.5/rest < 1/whole, rates from its probe at open
        two = t_gate + 0.5 * t_rest < t_whole
    else:
        two = bool(two_phase)
    per_miss = t_gate + precision * t_rest if two else t_whole
    reads = blocks * misses * ((1 + precision) if two else 1)
    t_mem = sum(mem.values()) / rate
    t_io = blocks * misses * per_miss
    # powerinfer2's pipeline: a block's wave issues its misses first, then computes the gate/up rows of its
    # cached neurons while they fly (sparse_ffn.c); the misses' rows and the down pass come after the last
    # read lands. The other policies read a wave whole before computing it.
    t_hits = blocks * per_block * hit * m.part_bytes * (1 + precision) / rate
    hidden = min(t_io, t_hits) if policy == "powerinfer2" else 0.0
    t_model = t = t_mem + t_io - hidden
    # Where the profile calibrated this model with these threads and this kind of read, a step is its
    # calibration's line in the reads (calibrate.step_fit: the engine's own cost of a read here, overlap
    # and completions included, which the device model above misses by 20-30% on the 47B shape either
    # way), moved by the memory side between the calibration's KV position and this one. A read's cost
    # falls as a block's wave grows (storage.waves); the line was drawn at the calibration's waves, so
    # its cost a read is scaled by the device's read time at this wave over that at the calibration's.
    fit = (cal or {}).get("step_fit")
    fitted = bool(fit) and policy == "powerinfer2" and not two and not cal.get("two_phase") \
        and int(cal["threads"]) == int(device.threads)  # fmt: skip
    if fitted:
        shift = (sum(mem.values()) - cal_mem) / rate
        cal_wave = float(cal["reads_per_token"]) / blocks
        per_read = fit["per_read_s"] * t_whole / wave_read_time(device, m, m.full_len, cal_wave)
        t = fit["base_s"] + per_read * reads + shift
        tbt_source = (f"the profile's decode calibration: a step = {fit['base_s'] * 1e3:.1f} ms + "
                      f"{fit['per_read_s'] * 1e6:.2f} us a read at its waves of {cal_wave:.0f} reads "
                      f"({per_read * 1e6:.2f} us at {misses:.0f}; fit over {fit['steps']} steps of "
                      f"{fit['reads_min']}-{fit['reads_max']} reads, r2 {fit['r2']:.2f})")  # fmt: skip
    else:
        tbt_source = "memory + storage - overlap"
    return {
        "model": m.name,
        "synthetic": m.synthetic,
        "device": device.name,
        "profile": device.source,
        "policy": policy,
        "memory_budget_bytes": int(budget),
        "ctx": int(ctx),
        "fixed_bytes": sz["fixed"],
        "cache_bytes": sz["cache"],
        "hot_neurons_per_block": sz["hot"],
        "cold_slots": sz["cold"],
        "cached_fraction": round(frac, 4),
        "hit_rate": round(hit, 4),
        "predicted_neurons_per_token": round(blocks * per_block),
        "named_source": f"measured ({named['decode_steps']} decode steps)" if named else "the design's curve",
        "compute_source": (f"the profile's decode calibration ({cal['timed_steps']} steps, {cal['threads']} threads, "
                           f"{cal['compute_s'] * 1e3:.1f} ms a step)") if cal else "the bandwidth probe",
        "compute_bytes_per_s": round(rate),
        "memory_bytes_per_token": {k: int(v) for k, v in mem.items()},
        "misses_per_token": round(blocks * misses),
        "two_phase": two,
        "storage_reads_per_token": round(reads),
        "storage_bytes_per_token": int(blocks * misses * (m.gate_len + precision * m.rest_len if two else m.full_len)),
        "read_queue_depth": round(min(queue_depth(), misses)),
        "whole_bundle_us": round(t_whole * 1e6, 2),
        "two_phase_us": round((t_gate + precision * t_rest) * 1e6, 2),
        "memory_ms": round(t_mem * 1e3, 2),
        "storage_ms": round(t_io * 1e3, 2),
        "overlap_ms": round(hidden * 1e3, 2),
        "model_tbt_ms": round(t_model * 1e3, 2),  # memory + storage - overlap
        "tbt_ms": round(t * 1e3, 2),
        "tbt_source": tbt_source,
        "tbt_fitted": fitted,  # tbt_ms from the calibration's line, not the device model
        "tok_s": round(1.0 / t, 3) if t > 0 else math.inf,
        "assumptions": f"decode at position {position}, context {ctx}; predicted fraction {per_block / m.n_ff:.3f}, precision "
        f"{precision:.2f}; steady-state cache (hot set + cold neurons up to the admit rank); "
        + "a block's reads overlap its cached neurons' gate/up rows, nothing else (the block waits for its reads)",
    }  # fmt: skip


def predictor_bytes(m: ModelFacts) -> int:
    """One block's fc1 + fc2 (F16) at the rank synth gives this shape (default_predictor_rank)."""
    rank = max(16, m.n_embd // (32 if m.arch == "moe" else 16))
    return 2 * (2 * rank * m.n_embd + m.n_ff * 2 * rank)


def predictor_bytes_in_file(path: str | Path) -> int | None:
    """The mean fc1 + fc2 bytes per block in a .pi2 (None without predictors)."""
    from pi2cli.models.pi2file import Pi2File

    f = Pi2File(path, verify=False)
    sizes = [t.nbytes for name, t in f.tensors.items() if ".pred_fc1" in name or ".pred_fc2" in name]
    blocks = f.header.n_layer * (f.header.n_expert or 1)
    return round_up(sum(sizes) // blocks, 1) if sizes else None


# ---------------------------------------------------------------------------------------- the command
def prediction_wanted(model: str, profile: str | Path | None) -> bool:
    """`pi2 plan` predicts (instead of writing a plan file) for a shipped or TOML device profile, or
    for a registry name with no file in the store (given a profile). A stored name plans as its file."""
    from pi2cli.models import store
    from pi2cli.models.registry import get_model

    prof = str(profile or "")
    if prof in shipped_profiles() or prof.endswith(".toml"):
        return True
    if prof and store.looks_like_name(model) and not Path(model).exists():
        return store.find(get_model(model)) is None
    return False


def facts_for(model: str) -> tuple[ModelFacts, int]:
    """(facts, predictor bytes per block): from the stored or given file when there is one, else from
    the registry's shapes as synth would write them."""
    from pi2cli.models import store
    from pi2cli.models.registry import get_model
    from pi2cli.plan.facts import model_facts

    path = Path(model)
    if not path.is_file() and store.looks_like_name(model):
        found = store.find(get_model(model))
        if found is None or found.pi2 is None:
            m = facts_from_registry(model)
            return m, predictor_bytes(m)
        path = found.pi2
    m = model_facts(path)
    return m, predictor_bytes_in_file(path) or predictor_bytes(m)


def run_prediction(model: str, profile: str, budget: int, ctx: int | None = None) -> dict:
    if profile:
        device = load_device(profile)
    else:
        raise Pi2Error("a prediction needs --profile: a shipped one "
                       f"({', '.join(shipped_profiles())}), a TOML file or a `pi2 profile` JSON")  # fmt: skip
    ctx = ctx or default_ctx()
    m, pred = facts_for(model)
    from pi2cli.plan.min_budget import refusal

    # the engine's rule, as for the bench: measured on the file when there is one, else for the shape
    if Path(model).suffix == ".pi2" and Path(model).is_file():
        from pi2cli.plan.min_budget import minimums_for_file

        answers = minimums_for_file(Path(model), ["powerinfer2"], ctx, device.threads, budget)
        line = refusal(budget, answers, m.name, ctx, device.threads)
    else:
        least = engine_split(m, budget, ctx, device.threads)
        line = (
            refusal(budget, {"powerinfer2": (least["fixed"], False)}, m.name, ctx, device.threads)
            if "too_small" in least
            else None
        )
    if line:
        raise Pi2Error(line)
    return predict(m, device, budget, pred_bytes_per_block=pred, ctx=ctx)
