"""Issue 9: the package's shape holds: layers import only downwards, no import cycles, short modules.

Layers, lowest first (a module may import its own layer's package and any lower layer):
errors/util -> codecs -> records -> store -> build | tune -> serve | fsspec -> cluster | train -> cli.
build and tune are siblings (neither imports the other); cluster sits beside serve and may use it;
train (the PyTorch side, which talks to a mount) is a sibling of cluster.  fsspec (the in-process
front, the only importer of the fsspec package) is a sibling of serve, the FUSE front: both present a
store (with tune's ``auto`` fidelity) and neither needs the other.
Every import counts, those inside functions too.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "fanfs"
RANK = {"base": 0, "codecs": 1, "records": 2, "store": 3, "build": 4, "tune": 4, "serve": 5, "fsspec": 5, "cluster": 6, "train": 6,
        "cli": 7}
GROUP = {"fanfs": "base", "errors": "base", "util": "base", "__main__": "cli"}  # modules that belong to a layer
MAX_LINES = 400


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    """fanfs modules (and packages) a file imports, relative imports resolved."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")
                parent = parent[:len(parent) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            if base.startswith("fanfs"):
                submodules = {f"{base}.{alias.name}" for alias in node.names} & modules
                found.update(submodules)
                if len(submodules) < len(node.names):  # a name defined by the package itself
                    found.add(base)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("fanfs"))
    return {m for m in found if m in modules and m != name}


def layer(module: str) -> str:
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else "fanfs"
    return GROUP.get(name, name)


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in PACKAGE.rglob("*.py")}


def test_every_module_has_a_layer():
    assert {layer(m) for m in graph()} <= set(RANK)


def test_layers_import_only_downwards():
    bad = []
    for module, targets in graph().items():
        for target in targets:
            a, b = layer(module), layer(target)
            if a != b and RANK[b] >= RANK[a]:
                bad.append(f"{module} -> {target}")
    assert not bad, "upward or sideways imports: " + ", ".join(sorted(bad))


def test_no_import_cycles():
    edges = graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                cycles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles: " + "; ".join(cycles)


def test_modules_are_short():
    long = {module_name(p): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long
