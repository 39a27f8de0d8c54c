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


# pi2cli's packages by layer (ARCHITECTURE.md, "The host suite"); modules at the top of pi2cli/ are the
# core (1) but for the command line itself
PY_LAYERS = {
    "cli": 9, "__main__": 9, "commands": 9, "farm": 8, "bench": 7, "quality": 6, "engines": 5, "plan": 4,
    "hw": 3, "workloads": 3, "model_files": 3, "targets": 2, "models": 2, "results": 2, "builds": 2,
}  # fmt: skip
# No arrow runs up a layer and no import circle is left (issue 33 removed the last ones: bench/plan's
# budget check and the sweep's two modules); an entry here would be one allowed back, with its reason
KNOWN_UP: set[tuple[str, str]] = set()
KNOWN_CIRCLES: list[set[str]] = []


def py_layer(module: str) -> int:
    parts = module.split(".")
    return PY_LAYERS.get(parts[1], 1) if len(parts) > 1 else 1


def py_imports() -> dict[str, set[str]]:
    """module -> the pi2cli modules it imports, at the top or inside a function (both run)."""
    import ast

    pkg = ROOT / "pi2cli"
    graph: dict[str, set[str]] = {}
    for path in sorted(pkg.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found = graph.setdefault(module, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                target = ROOT / name.replace(".", "/")
                if name.startswith("pi2cli") and (target.with_suffix(".py").is_file() or target.is_dir()):
                    found.add(name)
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_python_import_runs_up_a_layer():
    graph = py_imports()
    up = {(a, b) for a, targets in graph.items() for b in targets if py_layer(b) > py_layer(a)}
    assert up <= KNOWN_UP


def test_no_python_import_circle():
    found = circles(py_imports())
    assert all(any(c <= known for known in KNOWN_CIRCLES) for c in found), found


def test_only_the_command_layer_imports_click():
    # Pi2Error is a plain exception: the library layers never need the command-line toolkit
    users = sorted(
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "pi2cli").rglob("*.py")
        if re.search(r"^\s*(import click|from click\b)", path.read_text(), re.M)
    )
    assert users and all(u.startswith("pi2cli/commands/") or u == "pi2cli/cli.py" for u in users), users
