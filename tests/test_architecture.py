"""Issues 9 and 18: the package's shape holds: layers import only downwards, no import cycles, short modules,
every folder in the layer table and the design page's (docs/design.rst), ruff's rules; serve knows no cluster (nor its cache or peers); record kinds are
reached only through their registry.

Layers, lowest first (a module may import its own layer's package and any lower layer):
errors/util -> codecs -> records -> store -> ingest -> pack | tune -> serve | peers -> cache -> cluster | train
-> inproc -> cli | fsspec.
pack and tune are siblings (neither imports the other); so are serve (the mount) and peers (the MPI world,
placement and the peer protocol); cache (a node's staging, lazy fill, capacity, prefetch and local cache file)
uses peers and sits below cluster (what starts and runs a job), which uses them all and serve;
train (the PyTorch side, which talks to a mount) is a sibling of cluster.  fsspec (the in-process
front, the only importer of the fsspec package) sits on top, beside cli: on a cluster node it reads
the node's view, staged shards and peers, through the peers' authenticated client, as the node's mount
does; neither it nor cli imports the other.  inproc (the in-process fast path of ``fanfs run``: a mount's files opened
in the reader's own process, from what the mount hands over, a job node's peers included) sits below cli, whose
``fanfs run`` sets it up for the processes it starts.
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
RANK = {"base": 0, "codecs": 1, "records": 2, "store": 3, "ingest": 4, "pack": 5, "tune": 5, "serve": 6, "peers": 6,
        "cache": 7, "cluster": 8, "train": 8, "inproc": 9, "cli": 10, "fsspec": 10}
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


def cycles(edges: dict[str, set[str]]) -> list[str]:
    """Every import circle of a graph, each as ``a -> b -> a``."""
    state: dict[str, int] = {}
    found = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                found.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return found


def test_no_import_cycles():
    found = cycles(graph())
    assert not found, "import cycles: " + "; ".join(found)


TOOLS = REPO / "tools"
TOOL_RANK = {"support": 0, "emulated": 0, "": 1, "bench": 1}
"""tools/'s folders, lowest first: what the tests and the benchmarks share (the ``fanfs`` command, sample data)
and the emulated cluster; the user's commands at the top (the one-host Slurm) and the benchmarks.  A folder's
modules import their own folder's and lower ones'; the tests put every folder on ``sys.path``, so a module's
name is its file's name."""


def tool_modules(root: Path) -> dict[str, Path]:
    return {path.stem: path for path in sorted(root.rglob("*.py"))}


def tool_graph(root: Path) -> dict[str, set[str]]:
    """The tools modules each tools module imports (by name: they run with their folders on ``sys.path``)."""
    modules = tool_modules(root)
    edges = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.add(node.module.partition(".")[0])
            elif isinstance(node, ast.Import):
                found.update(alias.name.partition(".")[0] for alias in node.names)
        edges[name] = (found & set(modules)) - {name}
    return edges


def tool_folder(path: Path, root: Path = TOOLS) -> str:
    return str(path.parent.relative_to(root)).replace(".", "")


def test_tools_names_are_unique_and_every_folder_ranked():
    paths = sorted(TOOLS.rglob("*.py"))
    assert len({p.stem for p in paths}) == len(paths), "two tools modules share a name"
    assert {tool_folder(p) for p in paths} <= set(TOOL_RANK)


def test_tools_have_no_import_cycles_and_import_only_downwards():
    edges, modules = tool_graph(TOOLS), tool_modules(TOOLS)
    found = cycles(edges)
    assert not found, "import cycles in tools/: " + "; ".join(found)
    upward = [f"{a} -> {b}" for a, targets in edges.items() for b in targets
              if (fa := tool_folder(modules[a])) != (fb := tool_folder(modules[b])) and TOOL_RANK[fb] >= TOOL_RANK[fa]]
    assert not upward, "upward or sideways imports in tools/: " + ", ".join(sorted(upward))


def test_the_tools_cycle_check_finds_a_circle(tmp_path):
    """Issue 36's circle, drawn small: bench_cluster -> bench_emulated -> bench_lazy -> bench_cluster."""
    (tmp_path / "bench").mkdir()
    for name, imported in (("bench_cluster", "import bench_emulated"), ("bench_emulated", "from bench_lazy import rows"),
                           ("bench_lazy", "def f():\n    from bench_cluster import job"), ("benchlib", "import os")):
        (tmp_path / "bench" / f"{name}.py").write_text(imported + "\n")
    assert cycles(tool_graph(tmp_path)) == ["bench_cluster -> bench_emulated -> bench_lazy -> bench_cluster"]


def test_modules_are_short():
    """The package's modules and the tools alike (tools/ and its folders are code too)."""
    modules = [*PACKAGE.rglob("*.py"), *TOOLS.rglob("*.py")]
    long = {str(p.relative_to(REPO)): n for p in modules if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


MAX_PACKAGE_MODULES, MAX_PACKAGE_LINES = 14, 3000


def test_no_package_is_a_grab_bag():
    """Issue 36: a package holds at most 14 modules of its own (its ``__init__`` aside) and 3,000 lines with its
    sub-packages; one that grows past either is more than one concern."""
    big = {}
    for init in PACKAGE.glob("*/**/__init__.py"):  # fanfs's own folders (fanfs/ itself is the whole house)
        folder = init.parent
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        lines = sum(len(p.read_text().splitlines()) for p in folder.rglob("*.py"))
        if len(modules) > MAX_PACKAGE_MODULES or lines > MAX_PACKAGE_LINES:
            big[str(folder.relative_to(REPO))] = (len(modules), lines)
    assert not big, big


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
    """The mount takes a ready store and hooks from whoever mounts (a single node, a cluster node, a Slurm step):
    nothing of a job, its node's cache or its peers."""
    bad = [f"{module} -> {target}" for module, targets in graph().items() if layer(module) == "serve"
           for target in targets if layer(target) in ("cluster", "cache", "peers", "train")]
    assert not bad, bad


def test_what_starts_a_job_reaches_the_cache_through_one_door():
    """How a node gets its blobs (stage or lazy, capacity, prefetch) is the cache's to decide: what starts and runs a
    job calls :mod:`fanfs.cache.share`, never the cache's own modules, so a change to the cache touches its package."""
    bad = [f"{module} -> {target}" for module, targets in graph().items() if layer(module) == "cluster"
           for target in targets if layer(target) == "cache" and target != "fanfs.cache.share"]
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
