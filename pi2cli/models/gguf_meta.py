"""Read the key/value metadata of a GGUF file (not its tensors), fast.

gguf.GGUFReader builds numpy views of every field and tensor up front, which takes seconds on a
49k-token vocabulary; reading chat templates and tokenizer lists needs only the header, walked here
with struct over a memory map.
"""

import mmap
import os
import struct

from pi2cli.errors import Pi2Error

_SCALARS = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d",
}  # fmt: skip
_STRING, _ARRAY = 8, 9


def read_gguf_metadata(path: str | os.PathLike, keys: set[str] | None = None) -> dict:
    """{key: value} of a GGUF's metadata (all keys, or only `keys`); strings decode as UTF-8.

    Arrays become lists. Raises Pi2Error for a file that is not GGUF or is cut short.
    """
    try:
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _parse(data, keys)
    except (OSError, ValueError) as exc:
        raise Pi2Error(f"cannot read GGUF {path}: {exc}") from None
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise Pi2Error(f"GGUF {path} is truncated or corrupt ({exc})") from None


def _parse(data, keys: set[str] | None) -> dict:
    if data[:4] not in (b"GGUF", b"PWRI"):  # PWRI: PowerInfer's GGUFs, the same layout
        raise ValueError("not a GGUF file (bad magic)")
    version, _tensors, kv_count = struct.unpack_from("<IQQ", data, 4)
    if version not in (2, 3):
        raise ValueError(f"unsupported GGUF version {version}")
    pos = 24
    out = {}

    def string(at: int) -> tuple[str, int]:
        (length,) = struct.unpack_from("<Q", data, at)
        end = at + 8 + length
        if end > len(data):
            raise struct.error("string runs past the end of the file")
        return data[at + 8 : end].decode("utf-8"), end

    def value(kind: int, at: int, keep: bool):
        if kind in _SCALARS:
            fmt = _SCALARS[kind]
            return (struct.unpack_from(fmt, data, at)[0] if keep else None), at + struct.calcsize(fmt)
        if kind == _STRING:
            if keep:
                return string(at)
            (length,) = struct.unpack_from("<Q", data, at)
            return None, at + 8 + length
        if kind == _ARRAY:
            item_kind, count = struct.unpack_from("<IQ", data, at)
            at += 12
            if item_kind in _SCALARS:
                fmt = _SCALARS[item_kind]
                size = struct.calcsize(fmt) * count
                items = list(struct.unpack_from(f"<{count}{fmt[1]}", data, at)) if keep else None
                return items, at + size
            items = [] if keep else None
            for _ in range(count):
                item, at = value(item_kind, at, keep)
                if keep:
                    items.append(item)
            return items, at
        raise ValueError(f"unknown GGUF value type {kind}")

    for _ in range(kv_count):
        key, pos = string(pos)
        (kind,) = struct.unpack_from("<I", data, pos)
        keep = keys is None or key in keys
        item, pos = value(kind, pos + 4, keep)
        if keep:
            out[key] = item
        if keys is not None and keys <= out.keys():
            break
    return out
