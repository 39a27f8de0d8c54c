"""The bandwidth floor: no token comes faster than the device can read the weights that token needs.

Every engine reads, for every decoded token, at least the weights it computes densely: attention, norms
and the output head for all (plus the predictors for a sparse policy, plus every FFN weight for a dense
engine such as llama.cpp; token embeddings are one row, so they do not count). At the device's best
measured read bandwidth for a working set of that size (`pi2-probe membw` ON the target, each thread
reading its share, the fastest of fifteen passes, so a busy moment can only lower the floor), that takes
a time no real token beats. A turn whose TBT P50 is below it was not timed by the engine (host arrivals
through an adb forward, in bursts) and its run is stored as `invalid`, with the reason, never `ok`.

The floor is measured for the working set's size, not a fixed large buffer: a small model's weights
stay in the CPU's caches and are read far faster than DRAM (this VM's L3 holds 480 MiB), so a DRAM
floor would mark honest runs invalid.
"""

from __future__ import annotations

import math
import mmap
import re
import struct
from pathlib import Path

from pi2cli.errors import Pi2Error
from pi2cli.units import MiB, format_size

SPARSE_POLICIES = ("bundle", "cache", "llmflash", "powerinfer2")
PASSES = 15  # the most pi2-probe takes: the fastest of many, so a busy moment rarely sets the floor
_probed: dict[tuple, float] = {}  # (target, threads, MiB per thread) -> bytes/s, for the process's life


def bytes_per_token(model: Path, policy: str | None) -> int:
    """The weights every decoded token reads at least, for the file the engine runs and its policy."""
    model = Path(model)
    if model.suffix == ".pi2":
        return _pi2_bytes(model, policy)
    return _gguf_bytes(model)


def _pi2_bytes(model: Path, policy: str | None) -> int:
    from pi2cli.models.pi2file import Pi2File

    f = Pi2File(model, verify=False)
    h = f.header
    sparse = policy in SPARSE_POLICIES
    used, experts = max(1, h.n_expert_used), max(1, h.n_expert)
    total = 0
    for name, e in f.tensors.items():
        # an expert's own tensors end in .E (blk.L.ffn_down.weight.E, blk.L.pred_fc1.E): a token reads
        # those of the experts it is routed to, n_expert_used of n_expert
        base = re.sub(r"\.\d+$", "", name) if h.arch == "moe" else name
        if e.region == 0 or base == "token_embd.weight" or base.endswith("ffn_order"):
            continue  # the neuron region (counted below), one embedding row, index tables
        if base.endswith("ffn_down.weight") and sparse:
            continue  # the dense down copy: sparse policies use the bundles' own columns
        if ".pred_" in base and not sparse:
            continue  # predictors run only under a sparse policy
        total += e.nbytes * used // experts if base != name else e.nbytes
    if h.tied_embeddings:
        total += f.tensors["token_embd.weight"].nbytes  # it is the output head too
    if not sparse:  # a dense engine multiplies every FFN weight of the experts it uses
        from pi2cli.models.pi2file import row_size

        parts = 2 if h.dense_down else 3  # gate and up from the bundles, down from its copy (counted above)
        total += h.n_layer * used * h.n_ff * parts * row_size(h.neuron_type, h.n_embd)
    return total


def _gguf_bytes(model: Path) -> int:
    """Every tensor but the token embeddings (unless they are the output head too); experts' tensors
    scaled by the share of experts a token uses."""
    with open(model, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        try:
            tensors, meta = _gguf_tensors(data)
        except (struct.error, ValueError, KeyError, UnicodeDecodeError) as exc:
            raise Pi2Error(f"cannot read the tensors of {model}: {exc}") from None
    arch = meta.get("general.architecture", "")
    used, experts = meta.get(f"{arch}.expert_used_count") or 1, meta.get(f"{arch}.expert_count") or 1
    total = 0
    for name, nbytes in tensors.items():
        if name == "token_embd.weight" and "output.weight" in tensors:
            continue
        total += nbytes * used // experts if "_exps" in name else nbytes
    return total


def _gguf_tensors(data) -> tuple[dict[str, int], dict]:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    scalars = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    if data[:4] not in (b"GGUF", b"PWRI"):
        raise ValueError("not a GGUF file")
    _version, n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
    pos, meta = 24, {}

    def string(at):
        (n,) = struct.unpack_from("<Q", data, at)
        return data[at + 8 : at + 8 + n].decode("utf-8"), at + 8 + n

    def skip(kind, at):
        if kind in scalars:
            return at + scalars[kind]
        if kind == 8:
            return string(at)[1]
        item, count = struct.unpack_from("<IQ", data, at)
        at += 12
        if item in scalars:
            return at + scalars[item] * count
        for _ in range(count):
            at = skip(item, at)
        return at

    for _ in range(n_kv):
        key, pos = string(pos)
        (kind,) = struct.unpack_from("<I", data, pos)
        if key.endswith(("general.architecture", "expert_used_count", "expert_count")) and kind in (4, 8):
            meta[key] = string(pos + 4)[0] if kind == 8 else struct.unpack_from("<I", data, pos + 4)[0]
        pos = skip(kind, pos + 4)
    tensors = {}
    for _ in range(n_tensors):
        name, pos = string(pos)
        (n_dims,) = struct.unpack_from("<I", data, pos)
        dims = struct.unpack_from(f"<{n_dims}Q", data, pos + 4)
        kind, _offset = struct.unpack_from("<IQ", data, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + 12
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        tensors[name] = math.prod(dims) // block * size
    return tensors, meta


def best_bandwidth(target, working_set: int, threads: int) -> float:
    """Bytes/s: the fastest of PASSES `pi2-probe membw` passes on the target, `threads` threads each
    reading its share of `working_set` (at least 1 MiB). Measured once per target and size."""
    from pi2cli.plan.profile import parse_probe_json, probe_runner

    mib = max(1, math.ceil(working_set / threads / MiB))
    key = (target.name, threads, mib)
    if key not in _probed:
        out = parse_probe_json(probe_runner(target)(["membw", "--threads", str(threads), "--mib", str(mib),
                                                     "--passes", str(PASSES), "--json"]), "membw")  # fmt: skip
        _probed[key] = max(float(v) for v in out["passes_gb_per_s"]) * 1e9
    return _probed[key]


def tbt_floor(target, model: Path, policy: str | None, threads: int | None, engine: str = "") -> dict:
    """{"floor_ns", "bytes_per_token", "membw_bytes_per_s", "threads"}, or {"unavailable": why}."""
    if engine == "mlc-llm":  # its runner loads its own compiled weights, whose size the GGUF does not tell
        return {"unavailable": "mlc-llm runs its own compiled weights"}
    try:
        nbytes = bytes_per_token(model, policy)
        n = threads or int(target.facts().get("cores") or 1)
        bw = best_bandwidth(target, nbytes, n)
    except (Pi2Error, OSError, ValueError, KeyError) as exc:
        text = str(exc)
        return {"unavailable": " ".join(text.split())[:200]}
    return {
        "floor_ns": int(nbytes / bw * 1e9),
        "bytes_per_token": nbytes,
        "membw_bytes_per_s": bw,
        "threads": n,
    }


def below_floor(run: dict, floor: dict) -> str | None:
    """Why the run's token times cannot be the engine's (a turn's TBT P50 under the floor), else None."""
    import numpy as np

    from pi2cli.results import schema as S

    if "floor_ns" not in floor:
        return None
    turns = [t for t in S.measured_turns(run) if t["samples_ns"]]
    low = [
        (t, float(np.median(t["samples_ns"])))
        for t in turns
        if np.median(t["samples_ns"]) < floor["floor_ns"]
    ]
    if not low:
        return None
    turn, p50 = low[0]
    return (f"{len(low)} of {len(turns)} turns below the bandwidth floor: turn {turn['index']} TBT P50 "
            f"{p50 / 1e6:.3f} ms < {floor['floor_ns'] / 1e6:.3f} ms, the least time to read "
            f"{format_size(floor['bytes_per_token'])} of weights a token at the {floor['membw_bytes_per_s'] / 1e9:.1f} "
            f"GB/s measured on the device ({floor['threads']} threads); these are not the engine's token times")  # fmt: skip


def apply_floor(run: dict, floor: dict) -> str | None:
    """Record the floor in the run's counters and mark an ok run below it `invalid`; returns the reason."""
    from pi2cli.results import schema as S

    if "floor_ns" in floor:
        S.set_counters(run, tbt_floor_ns=floor["floor_ns"], tbt_floor_bytes_per_token=floor["bytes_per_token"],
                       tbt_floor_membw_bytes_per_s=round(floor["membw_bytes_per_s"]))  # fmt: skip
    else:
        S.set_counters(run, tbt_floor=f"unavailable: {floor.get('unavailable', 'not measured')}")
    reason = below_floor(run, floor) if run["status"] == S.STATUS_OK else None
    if reason:
        S.mark_failed(run, "invalid", reason)
    return reason
