"""The import layering of the code: the data's way (instrumentation -> collector_processor ->
rca_service) and, inside rca_service, one package per stage (docs/architecture.md). Fails on an
arrow from an earlier stage back up to a later one, and on any import circle, naming them."""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterable
from pathlib import Path

import networkx as nx

from tests.conftest import REPO

# where each package of the distribution lives (pyproject's package-dir)
PACKAGE_DIRS = {"mycroft": "mycroft", "mycroft.instrumentation": "instrumentation", "mycroft.native": "native",
                "mycroft.collector_processor": "collector_processor", "mycroft.rca_service": "rca_service"}
# rca_service's stages in the order the data takes; a module may import its own stage or an earlier one.
# config and metrics are leaves every stage reads; service, cli and the stable `frames` path wire the rest
RCA_STAGES = {"config": 0, "metrics": 0, "ingest": 1, "analysis": 2, "incidents": 3, "web": 4, "postmortem": 4,
              "service": 5, "cli": 5, "frames": 5, "__init__": 5}
WIRING = {"service", "cli", "frames", "__init__"}  # the top: they may import each other
# top-level packages of the data's way that must not know each other in the other direction
NEVER = {("instrumentation", "collector_processor"), ("instrumentation", "rca_service"),
         ("collector_processor", "instrumentation"), ("collector_processor", "rca_service"),
         ("rca_service", "instrumentation"), ("rca_service", "collector_processor")}


# circles known and not yet cut; each must still exist (the test fails once one is gone, to drop it here)
PENDING_CIRCLES: set[frozenset[str]] = set()


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the distribution."""
    out: dict[str, Path] = {}
    for package, folder in PACKAGE_DIRS.items():
        root = REPO / folder
        # a compiled module (_fold_fast, _otlp_fast) is a module too: its type stub stands for it
        for path in [*root.rglob("*.py"), *(p for p in root.rglob("*.pyi") if not p.with_suffix(".py").exists())]:
            parts = path.relative_to(root).with_suffix("").parts
            if package == "mycroft" and len(parts) > 1:
                continue  # mycroft/ holds the shared modules and mycroft.faults; the others map elsewhere
            out[".".join((package, *parts)).removesuffix(".__init__")] = path
        if package == "mycroft":
            for path in (root / "faults").glob("*.py"):
                out[".".join(("mycroft.faults", path.stem)).removesuffix(".__init__")] = path
    return out


def imports_of(module: str, path: Path, known: Iterable[str]) -> set[str]:
    """The modules of `known` that `module` imports anywhere (top level, in functions, under TYPE_CHECKING)."""
    known = set(known)
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                if f"{source}.{alias.name}" in known:  # `from package import module`
                    out.add(f"{source}.{alias.name}")
                elif source in known:
                    out.add(source)
    out.discard(module)
    return out


def import_graph() -> nx.DiGraph:
    files = module_files()
    graph = nx.DiGraph()
    graph.add_nodes_from(files)
    for module, path in files.items():
        graph.add_edges_from((module, target) for target in imports_of(module, path, files))
    return graph


def rca_stage(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["mycroft", "rca_service"]:
        return None
    return parts[2] if len(parts) > 2 else "__init__"


def top_package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and f"mycroft.{parts[1]}" in PACKAGE_DIRS) else ""


def layering_faults(graph: nx.DiGraph, pending: Collection[frozenset[str]] = ()) -> list[str]:
    """Every arrow back up and every circle, as lines a reader can act on. Pure: graph in, faults out."""
    faults = []
    for source, target in graph.edges:
        a, b = rca_stage(source), rca_stage(target)
        if a is not None and b is not None and a != b:
            if a not in RCA_STAGES or b not in RCA_STAGES:
                faults.append(f"{source} -> {target}: a stage the layering does not know ({a} / {b})")
            elif RCA_STAGES[a] < RCA_STAGES[b] or (RCA_STAGES[a] == RCA_STAGES[b] and a != b and a not in WIRING):
                faults.append(f"{source} -> {target}: stage {a} imports the later (or sibling) stage {b}")
        if (top_package(source), top_package(target)) in NEVER:
            faults.append(f"{source} -> {target}: {top_package(source)} must not import {top_package(target)}")
    for cycle in nx.simple_cycles(graph):
        if frozenset(cycle) not in pending:
            faults.append("import circle: " + " -> ".join([*cycle, cycle[0]]))
    return faults


def test_the_code_follows_the_datas_way_without_circles() -> None:
    graph = import_graph()
    assert graph.number_of_nodes() > 100 and graph.has_edge("mycroft.rca_service.service",
                                                            "mycroft.rca_service.ingest.queue")
    assert layering_faults(graph, PENDING_CIRCLES) == []
    circles = {frozenset(cycle) for cycle in nx.simple_cycles(graph)}
    assert circles >= PENDING_CIRCLES, f"cut already, drop from PENDING_CIRCLES: {PENDING_CIRCLES - circles}"


def test_the_check_names_an_arrow_back_up_and_a_circle() -> None:
    graph = nx.DiGraph([("mycroft.rca_service.analysis.verdict", "mycroft.rca_service.ingest.state"),
                        ("mycroft.rca_service.ingest.state", "mycroft.rca_service.analysis.pauses"),
                        ("mycroft.rca_service.web.pages", "mycroft.rca_service.postmortem.loaders"),
                        ("mycroft.faults.inject", "mycroft.faults.netfault"),
                        ("mycroft.faults.netfault", "mycroft.faults.inject"),
                        ("mycroft.instrumentation.runtime", "mycroft.rca_service.config")])
    faults = layering_faults(graph)
    assert any("ingest.state -> mycroft.rca_service.analysis.pauses: stage ingest imports the later" in f
               for f in faults), faults
    assert any("web.pages -> mycroft.rca_service.postmortem.loaders" in f for f in faults), faults
    assert any(f.startswith("import circle:") and "inject" in f and "netfault" in f for f in faults), faults
    assert any("instrumentation must not import rca_service" in f for f in faults), faults
    assert len(faults) == 4, faults
