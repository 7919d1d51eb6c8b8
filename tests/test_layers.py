"""The package's layer order (README, *Architecture*): a module imports only from its own layer
or the layers below it, and no set of modules imports itself round in a circle.

Every import counts, at module level, inside functions and under TYPE_CHECKING alike: a lazy
import upward is still an upward dependency, only hidden.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "art_rlvr"

# Top to bottom. The first component of a module's name under art_rlvr picks its layer.
LAYERS: list[tuple[str, set[str]]] = [
    ("entry points", {"run", "compare", "report", "export", "export_dataset", "serve"}),
    ("config and loops", {"config", "loops"}),
    ("extensions", {"gepa", "ei"}),
    ("rollouts and evaluation", {"rollouts", "eval"}),
    ("scenarios", {"scenarios"}),
    ("backend", {"backend"}),
    ("llm client", {"llm"}),
    ("observe", {"observe"}),
    ("run folder", {"rundir"}),
    ("core", {"core", "testing", "__init__"}),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int:
    parts = module.split(".")
    head = parts[1] if len(parts) > 1 else "__init__"
    for index, (_, members) in enumerate(LAYERS):
        if head in members:
            return index
    raise AssertionError(f"{module} is in no layer: add it to LAYERS and to the README")


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """Every art_rlvr module `module` imports (`from a.b import c` is `a.b.c` if that is a
    module, else `a.b`); relative imports resolved against the module's package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found |= {
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            }
    return {name for name in found if name in known and name != module}


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {m: imports_of(m, p, set(modules)) for m, p in modules.items()}


def test_the_graph_is_read() -> None:
    graph = import_graph()
    assert len(graph) > 40
    assert "art_rlvr.loops.context" in graph["art_rlvr.loops.rl"]
    assert "art_rlvr.core.outcome" in graph["art_rlvr.observe.tracing"]


def test_every_module_has_a_layer() -> None:
    for module in all_modules():
        layer_of(module)


def test_no_module_imports_from_a_layer_above_it() -> None:
    upward = [
        f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
        for m, targets in import_graph().items()
        for t in sorted(targets)
        if layer_of(t) < layer_of(m)
    ]
    assert not upward, "imports that run upward:\n" + "\n".join(upward)


def test_outside_the_backend_only_its_public_api_is_imported() -> None:
    """`art_rlvr.backend`'s subpackages are its own: the rest of the package imports the names
    `art_rlvr/backend/__init__.py` exports (tests and benchmarks may reach further in)."""
    inward = [
        f"{m} imports {t}"
        for m, targets in import_graph().items()
        if m != "art_rlvr.backend" and not m.startswith("art_rlvr.backend.")
        for t in sorted(targets)
        if t.startswith("art_rlvr.backend.")
    ]
    assert not inward, "imports past art_rlvr.backend's public API:\n" + "\n".join(inward)


def test_the_backends_public_api_is_small() -> None:
    """The rest of the package reaches the backend through these names alone, so they stay a
    handful (at most 8), and each of them resolves."""
    import art_rlvr.backend as backend

    assert len(backend.__all__) <= 8, backend.__all__
    assert all(getattr(backend, name) is not None for name in backend.__all__)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path of modules, or None (iterative DFS, three colours)."""
    colour = dict.fromkeys(graph, 0)
    for root in sorted(graph):
        if colour[root]:
            continue
        stack: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        colour[root] = 1
        while stack:
            node, pending = stack[-1]
            if not pending:
                colour[node] = 2
                stack.pop()
                continue
            nxt = pending.pop()
            if colour[nxt] == 1:
                path = [n for n, _ in stack]
                return [*path[path.index(nxt) :], nxt]
            if colour[nxt] == 0:
                colour[nxt] = 1
                stack.append((nxt, sorted(graph[nxt])))
    return None


def test_there_are_no_import_cycles() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize(
    ("graph", "has_cycle"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, False),
        ({"a": {"b"}, "b": {"a"}}, True),
        ({"a": {"b", "c"}, "b": {"c"}, "c": {"d"}, "d": {"b"}}, True),
        ({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}, False),
    ],
)
def test_the_cycle_finder_finds_cycles(graph: dict[str, set[str]], has_cycle: bool) -> None:
    assert (find_cycle(graph) is not None) == has_cycle


def unit_of(module: str) -> str:
    """The top-level package (or entry module) a module belongs to: one box of the picture."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def package_graph() -> dict[str, set[str]]:
    """Which top-level package imports which (`core`, `testing` and `__init__` left out: every
    layer may use the core, and the picture is about the rest)."""
    hidden = {"core", "testing", "__init__"}
    graph: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        source = unit_of(module)
        if source in hidden:
            continue
        graph.setdefault(source, set()).update(
            unit_of(t) for t in targets if unit_of(t) not in hidden | {source}
        )
    return graph


def reduced(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The edges worth drawing: packages that import each other (a cycle, one layer) keep their
    edges; between such groups an edge goes when a longer path already implies it."""
    nodes = sorted(set(graph) | {b for bs in graph.values() for b in bs})

    def reach(start: str) -> set[str]:
        seen, todo = {start}, [start]
        while todo:
            for nxt in graph.get(todo.pop(), set()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reaches = {n: reach(n) for n in nodes}
    group = {n: frozenset(m for m in nodes if m in reaches[n] and n in reaches[m]) for n in nodes}

    def implied(a: str, b: str) -> bool:
        """A path from a's group to b's group through a third group."""
        return any(group[m] not in (group[a], group[b]) and b in reaches[m] for m in reaches[a])

    return {
        a: {b for b in bs if group[a] == group[b] or not implied(a, b)} for a, bs in graph.items()
    }


def mermaid() -> str:
    """docs/architecture.md's picture: each layer a box of its packages, each arrow an import
    that no longer path implies."""
    lines = ["flowchart TD"]
    hidden = {"core", "testing", "__init__"}
    for index, (name, members) in enumerate(LAYERS, start=1):
        packages = sorted(members - hidden)
        if packages:
            lines.append(f'  subgraph L{index}["{index} {name}"]')
            lines += [f"    {p}" for p in packages]
            lines.append("  end")
    graph = reduced(package_graph())
    lines += [f"  {a} --> {b}" for a in sorted(graph) for b in sorted(graph[a])]
    return "\n".join(lines)
