"""Issues 9 and 18: the package's shape holds: layers import only downwards, no import cycles, short modules,
every folder in the layer table and the design page's (docs/design.rst), ruff's rules; serve knows no cluster; record kinds are
reached only through their registry.

Layers, lowest first (a module may import its own layer's package and any lower layer):
errors/util -> codecs -> records -> store -> ingest -> pack | tune -> serve -> cluster | train -> cli | fsspec.
pack and tune are siblings (neither imports the other); cluster sits beside serve and may use it;
train (the PyTorch side, which talks to a mount) is a sibling of cluster.  fsspec (the in-process
front, the only importer of the fsspec package) sits on top, beside cli: on a cluster node it reads
the node's view, staged shards and peers, through cluster's authenticated client, as the node's mount
does; neither it nor cli imports the other.
Every import counts, those inside functions too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "fanfs"
RANK = {"base": 0, "codecs": 1, "records": 2, "store": 3, "ingest": 4, "pack": 5, "tune": 5, "serve": 6, "cluster": 7,
        "train": 7, "cli": 8, "fsspec": 8}
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
    """The package's modules and the tools alike (tools/ is code too)."""
    modules = [*PACKAGE.rglob("*.py"), *(REPO / "tools").glob("*.py")]
    long = {str(p.relative_to(REPO)): n for p in modules if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_ruff_passes():
    """ruff's default rules, less those pyproject.toml leaves out, over the package, the tools, the tests and the
    documentation's Sphinx configuration and extension."""
    pytest.importorskip("ruff")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "fanfs", "tools", "tests", "docs"], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_package_folder_is_in_the_layer_table_and_the_design_page():
    folders = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert folders <= set(RANK) | set(GROUP), folders - set(RANK) - set(GROUP)
    design = (REPO / "docs" / "design.rst").read_text()
    assert not [name for name in folders if f"``fanfs/{name}/``" not in design]


def test_serve_imports_nothing_of_cluster_or_train():
    """The mount takes a ready store and hooks from whoever mounts (a single node, a cluster node, a Slurm step)."""
    bad = [f"{module} -> {target}" for module, targets in graph().items() if layer(module) == "serve"
           for target in targets if layer(target) in ("cluster", "train")]
    assert not bad, bad


KIND_TOOLS = {"fanfs.tune.fidelity": "fanfs.records.jpeg", "fanfs.tune.curve": "fanfs.records.jpeg", "fanfs.pack.select.floatprobe": "fanfs.records.floats"}
"""Modules that are one kind's own tools (the fidelity curve of JPEG records, select's measure of float records),
and the kind they may import."""


REGISTRY = {"fanfs.records", "fanfs.records.base", "fanfs.records.settings"}
"""The registry and the interface of record kinds (what ``fanfs.records`` exports)."""


def test_record_kinds_are_reached_only_through_the_registry():
    """Outside fanfs/records/, only the registry is imported: never a kind's own module."""
    bad = []
    for module, targets in graph().items():
        if layer(module) == "records":
            continue
        for target in targets:
            if layer(target) == "records" and target not in REGISTRY \
                    and not target.startswith(KIND_TOOLS.get(module, "-")):
                bad.append(f"{module} -> {target}")
    assert not bad, "kind modules imported outside fanfs/records/: " + ", ".join(sorted(bad))


OWN = {("fanfs.cli.serve", "--max-pixels")}


def test_a_kinds_options_are_declared_by_the_kind_alone():
    """No module outside fanfs/records/ spells an option or a job variable a kind declares (``--fidelity``,
    ``--progressive-jpeg``, ``FANFS_PRECISION``...): they all read them from the registry.  The demo is a user's
    session typed out, so it may; ``fanfs fidelity`` (the JPEG kind's curve) has a ``--max-pixels`` of its own
    (which sampled records it measures), as pack's."""
    from fanfs.records import kinds, settings
    declared = {flag for setting in settings() for flag in (setting.option, setting.variable)}

    def add(*flags: str, **kwargs: object) -> None:
        declared.update(flags)

    for kind in kinds().values():
        kind.pack_options(add)
        kind.select_options(add)
    assert {"--fidelity", "--precision", "--progressive-jpeg", "--float-error", "FANFS_FIDELITY"} <= declared
    bad = []
    for path in PACKAGE.rglob("*.py"):
        module = module_name(path)
        if layer(module) == "records" or module == "fanfs.cli.demo":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in declared and (module, node.value) not in OWN:
                bad.append(f"{module}:{node.lineno} {node.value}")
    assert not bad, bad
