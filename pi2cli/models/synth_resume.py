"""Resuming an interrupted `pi2 models synth`: a checkpoint after every layer.

A full-size synthesis runs for many minutes and writes tens of GB; a Ctrl-C, a kill or a reboot
should cost one layer, not the run. Both writers write at final offsets (the .pi2's FFN blocks and
resident tensors, the GGUF twin's tensors by pwrite), so a run can reopen their temp files
(`.model.pi2.partial`, `.model.gguf.partial`) and go on. After each layer the files are fsynced, then
`.synth-state.json` records what is durable: the .pi2 writer's tensor table, CRCs and positions, the
twin's next tensor and the per-layer statistics, with the sha256 of `.synth-state.x.npy` (the residual
stream of the calibration/held-out rows, a plain float32 array). The state is plain data: a model
directory may be shared or downloaded, so nothing read from it may run code (no pickle; numpy loads
the array with allow_pickle=False). A state whose fingerprint (options, shapes, generator version)
differs from this run's, or whose fields do not fit this run, is ignored and the run starts over.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
from pathlib import Path

import numpy as np

from pi2cli.models.pi2file import SEC_NEURONS, SEC_RESIDENT, TYPES, Pi2Writer, TensorEntry
from pi2cli.models.synth_stats import LayerStats

STATE_NAME = ".synth-state.json"
X_NAME = ".synth-state.x.npy"  # the residual stream of the calibration/held-out rows
LEGACY_NAME = ".synth-state.pkl"
STATE_FORMAT = 1
MAX_STATE_BYTES = 64 << 20  # the JSON: tensor table and per-layer statistics, far below this
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
            self._fd = os.open(self._tmp, os.O_WRONLY | os.O_NOFOLLOW)
            for key, value in resume_state.items():
                setattr(self, key, value)
        else:
            # a fresh start: whatever is at the temp name goes (a planted link is removed, never followed)
            self._tmp.unlink(missing_ok=True)
            self._fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)

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


def _entry_ok(e) -> bool:
    return (
        isinstance(e, list) and len(e) == 6 and isinstance(e[0], str) and e[1] in TYPES
        and isinstance(e[2], list) and 1 <= len(e[2]) <= 4 and all(_is_int(d) and d >= 1 for d in e[2])
        and e[3] in (SEC_NEURONS, SEC_RESIDENT) and _is_int(e[4]) and e[4] >= 0 and _is_int(e[5]) and e[5] >= 0
    )  # fmt: skip


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _pi2_state(raw) -> dict | None:
    """The .pi2 writer's snapshot from its JSON form, or None when any field is not what a snapshot holds."""
    if not isinstance(raw, dict) or set(raw) != {"entries", "names", "resident_pos", "crc", "ffn_done"}:
        return None
    entries, names, crc = raw["entries"], raw["names"], raw["crc"]
    if not (isinstance(entries, list) and all(_entry_ok(e) for e in entries)):
        return None
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        return None
    if not (isinstance(crc, dict) and set(crc) == {str(SEC_NEURONS), str(SEC_RESIDENT)}
            and all(_is_int(v) and 0 <= v < 1 << 32 for v in crc.values())):  # fmt: skip
        return None
    if not all(_is_int(raw[k]) and raw[k] >= 0 for k in ("resident_pos", "ffn_done")):
        return None
    return {
        "entries": [TensorEntry(e[0], e[1], tuple(e[2]), e[3], e[4], e[5]) for e in entries],
        "_names": set(names),
        "_resident_pos": raw["resident_pos"],
        "_crc": {int(k): v for k, v in crc.items()},
        "_ffn_done": raw["ffn_done"],
    }


def _per_layer(raw, n: int) -> list[LayerStats] | None:
    fields = {f.name for f in dataclasses.fields(LayerStats)}
    if not (isinstance(raw, list) and len(raw) == n):
        return None
    if not all(isinstance(r, dict) and set(r) == fields for r in raw):
        return None
    try:
        return [LayerStats(**r) for r in raw]
    except TypeError:
        return None


def load(out_dir: Path, fp: str, n_layer: int, x_shape: tuple[int, int]) -> dict | None:
    """The checkpoint in out_dir if it belongs to this run: same fingerprint, every field of the type
    and range this run's shapes allow, the residual array's shape and hash as recorded, and the temp
    files present as regular files. Anything else starts the run over; nothing in it is executed."""
    out_dir = Path(out_dir)
    try:
        raw = json.loads(_read_regular(out_dir / STATE_NAME, MAX_STATE_BYTES))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(raw, dict) or raw.get("format") != STATE_FORMAT or raw.get("fingerprint") != fp:
        return None
    layer_done, twin_next = raw.get("layer_done"), raw.get("twin_next")
    if not (_is_int(layer_done) and 1 <= layer_done <= n_layer and _is_int(twin_next) and twin_next >= 0):
        return None
    per_layer = _per_layer(raw.get("per_layer"), layer_done)
    pi2 = _pi2_state(raw["pi2"]) if raw.get("pi2") is not None else None
    if per_layer is None or (raw.get("pi2") is not None and pi2 is None):
        return None
    x = _load_x(out_dir / X_NAME, tuple(x_shape), raw.get("x_sha256"))
    if x is None:
        return None
    need = [out_dir / ".model.gguf.partial"] + ([out_dir / ".model.pi2.partial"] if pi2 else [])
    if not all(p.is_file() and not p.is_symlink() for p in need):
        return None
    return {"fingerprint": fp, "layer_done": layer_done, "x": x, "per_layer": per_layer, "pi2": pi2,
            "twin_next": twin_next}  # fmt: skip


def _read_regular(path: Path, limit: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path} is over {limit} bytes")
    return data


def _load_x(path: Path, shape: tuple[int, int], sha: object):
    """The residual stream: a plain float32 .npy (numpy refuses object arrays with allow_pickle=False)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            # the header first: a shape it declares is allocated by np.load before any check of ours
            read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                           (2, 0): np.lib.format.read_array_header_2_0}.get(np.lib.format.read_magic(f))  # fmt: skip
            if read_header is None or read_header(f) != (shape, False, np.dtype("<f4")):
                return None
            f.seek(0)
            x = np.load(f, allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    if x.dtype != np.float32 or x.shape != shape or _sha256(x) != sha:
        return None
    return x


def _sha256(x: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(x).view(np.uint8)).hexdigest()


def _pi2_json(snap: dict) -> dict:
    return {
        "entries": [[e.name, e.type, list(e.shape), e.region, e.offset, e.nbytes] for e in snap["entries"]],
        "names": sorted(snap["_names"]),
        "resident_pos": snap["_resident_pos"],
        "crc": {str(k): v for k, v in snap["_crc"].items()},
        "ffn_done": snap["_ffn_done"],
    }


def save(out_dir: Path, state: dict) -> None:
    """Write the residual array, then the JSON that names its hash (each fsynced, then renamed in):
    a crash between the two leaves a hash mismatch, which starts the run over rather than resuming wrong."""
    out_dir = Path(out_dir)
    x = np.ascontiguousarray(state["x"], dtype=np.float32)
    doc = {
        "format": STATE_FORMAT, "fingerprint": state["fingerprint"], "layer_done": int(state["layer_done"]),
        "twin_next": int(state["twin_next"]), "x_sha256": _sha256(x),
        "per_layer": [dataclasses.asdict(s) for s in state["per_layer"]],
        "pi2": _pi2_json(state["pi2"]) if state["pi2"] is not None else None,
    }  # fmt: skip
    _replace(out_dir / X_NAME, lambda f: np.save(f, x, allow_pickle=False))
    _replace(out_dir / STATE_NAME, lambda f: f.write(json.dumps(doc).encode()))


def _replace(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def clear(out_dir: Path) -> None:
    # LEGACY_NAME: the pickle earlier versions wrote; removed unread, never loaded
    for name in (STATE_NAME, X_NAME, LEGACY_NAME):
        (Path(out_dir) / name).unlink(missing_ok=True)
        (Path(out_dir) / (name + ".tmp")).unlink(missing_ok=True)
