"""The layer rules of docs/ARCHITECTURE.md, checked on the source: nothing includes or imports a layer
above its own, and no two modules import each other round a circle."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NATIVE_SRC = ROOT / "native" / "src"

# native/src's folders from the bottom up (ARCHITECTURE.md, "The engine"; native/CMakeLists.txt)
NATIVE_LAYERS = ["base", "io", "kernels", "model", "tokenizer", "sparse", "engine", "server", "programs"]


def native_includes() -> list[tuple[Path, str]]:
    """(file, header) for every `#include "header"` under native/src."""
    found = []
    for path in sorted(NATIVE_SRC.rglob("*.[ch]")):
        for header in re.findall(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(), re.M):
            found.append((path, header))
    return found


def test_every_native_source_sits_in_a_layer_folder():
    # the programs' mains have a folder of their own: nothing is left at the top of native/src
    folders = {p.parent.relative_to(NATIVE_SRC).as_posix() for p in NATIVE_SRC.rglob("*.[ch]")}
    assert folders <= set(NATIVE_LAYERS)


def test_no_native_include_runs_up_a_layer():
    # includes name the bare file (every folder is on the include path), so each name is one file
    where = {}
    for path in NATIVE_SRC.rglob("*.[ch]"):
        assert path.name not in where, f"two headers named {path.name}: {path} and {where[path.name]}"
        where[path.name] = path
    up = []
    for path, header in native_includes():
        target = where.get(header)
        if target is None:
            continue  # a system header quoted, or one from outside src/ (none today)
        src_layer = NATIVE_LAYERS.index(path.parent.name)
        dst_layer = NATIVE_LAYERS.index(target.parent.name)
        if dst_layer > src_layer:
            up.append(f"{path.relative_to(NATIVE_SRC)} includes {target.relative_to(NATIVE_SRC)}")
    assert not up
