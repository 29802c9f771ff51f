"""The import graph of devlab/ and tools/, read from the source: no module imports, however
indirectly, one that imports it back (module-level and function-level imports alike), and every
layer imports only the layers below it (docs/architecture.md draws them)."""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("devlab", "tools")

def modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Every module under `packages`, by dotted name (a package by its __init__.py)."""
    found: dict[str, Path] = {}
    for top in packages:
        for path in sorted((root / top).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules among `known` that module `name` imports anywhere in its code (at module
    level, in a function, under a condition), relative imports resolved. `from p import x`
    imports module p.x if there is one, else p."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                if f"{source}.{alias.name}" in known:
                    found.add(f"{source}.{alias.name}")
                elif source in known:
                    found.add(source)
    found.discard(name)
    return found


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    known = modules(root, packages)
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One import cycle per group of modules that import each other (a strongly connected
    component), as the modules along it, the first repeated at the end."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for start in sorted(graph):  # Tarjan's algorithm, iterative
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(group)
    return [_loop(min(group), graph, group) for group in groups]


def _loop(first: str, graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """The shortest path of imports from `first` back to it inside `group`."""
    came: dict[str, str] = {}
    queue = deque([first])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph[node] & group):
            if nxt == first:
                path = [node]
                while path[-1] != first:
                    path.append(came[path[-1]])
                return [*reversed(path), first]
            if nxt not in came:
                came[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"{first} is in no cycle")


# devlab's layers, lowest first: a module may import modules of its own layer and of those below
# it, never one above (docs/architecture.md draws them). A module is in the layer of the longest
# prefix listed; the package's own __init__ and __main__ are above all.
LAYERS = (
    ("devlab._helpers",),
    ("devlab.engine.gpu_model",),
    ("devlab.engine",),
    ("devlab.core",),
    ("devlab.fronts",),
)
# devlab.engine.simulated's sub-packages, lowest first: a module in one may import modules of
# its own sub-package and of those before it. The package's own __init__ (start and stop) is
# above all of them.
SIMULATED = "devlab.engine.simulated"
SIMULATED_LAYERS = ("base", "clock", "mode", "cuda", "torch_distributed", "instruments")


def layer_of(module: str) -> int:
    """The index of a module's layer in LAYERS; len(LAYERS) for the package itself."""
    best, found = -1, len(LAYERS)
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), i
    return found


def _sub_layer(module: str) -> int | None:
    """The index of a simulation module's sub-layer; None for the simulation's own package."""
    if module == SIMULATED:
        return None
    return SIMULATED_LAYERS.index(module.split(".")[3])


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles (break each: move what both need below both):\n" + "\n".join(
        " -> ".join(c) for c in found)


def test_every_module_is_in_a_layer():
    outside = [m for m in import_graph() if m.startswith("devlab.")
               and m != "devlab.__main__" and layer_of(m) == len(LAYERS)]
    assert not outside, f"modules in no layer of LAYERS (put each in a folder of one): {outside}"


def test_layers_import_only_layers_below():
    graph = import_graph()
    upward = [f"{m} imports {t}" for m in sorted(graph) if m.startswith("devlab")
              for t in sorted(graph[m]) if t.startswith("devlab") and layer_of(t) > layer_of(m)]
    assert not upward, "imports of a higher layer:\n" + "\n".join(upward)


def test_simulation_sub_packages_import_only_layers_below():
    graph = import_graph()
    simulation = [m for m in graph if m == SIMULATED or m.startswith(SIMULATED + ".")]
    unplaced = [m for m in simulation
                if m != SIMULATED and m.split(".")[3] not in SIMULATED_LAYERS]
    assert not unplaced, f"modules in no declared layer (SIMULATED_LAYERS): {unplaced}"
    upward = [f"{m} ({SIMULATED_LAYERS[_sub_layer(m)]}) imports {t}"
              for m in simulation if m != SIMULATED
              for t in sorted(graph[m]) if t in simulation
              and (_sub_layer(t) is None or _sub_layer(t) > _sub_layer(m))]
    assert not upward, "imports of a higher layer:\n" + "\n".join(upward)


def _module_level_imports(tree: ast.Module) -> set[str]:
    """The top-level packages a module imports when it is imported (not inside a function)."""
    found: set[str] = set()
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
        todo.extend(ast.iter_child_nodes(node))
    return found


def test_the_pure_model_imports_no_torch_on_import():
    # devlab.engine.gpu_model is pure (its docstring): the model, the allocator and the clock
    # run on numbers alone; only ops_catalog's lookups import torch, inside the call that asks.
    model = [(m, p) for m, p in modules().items() if layer_of(m) == 1]
    assert any(m.endswith(".modeled_clock") for m, _ in model)
    heavy = [m for m, p in model if "torch" in _module_level_imports(ast.parse(p.read_text()))]
    assert not heavy, f"modules of the pure model importing torch on import: {heavy}"


def test_module_level_imports_leave_functions_out():
    tree = ast.parse("import os\nif True:\n    from torch import nn\n"
                     "class A:\n    import json\n    def f(self):\n        import numpy\n")
    assert _module_level_imports(tree) == {"os", "torch", "json"}


def test_no_two_rooms_share_a_name():
    rooms: dict[str, list[str]] = {}
    for name in modules(ROOT, ("devlab",)):
        if name not in ("devlab", "devlab.__main__"):
            rooms.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    shared = {room: names for room, names in rooms.items() if len(names) > 1}
    assert not shared, f"modules or packages of one name (name each for what it holds): {shared}"


def test_the_graph_reads_every_kind_of_import(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .a import thing\n")
    (pkg / "sub" / "a.py").write_text("def f():\n    from .. import b\n    import pkg.c\n")
    (pkg / "b.py").write_text("if True:\n    from pkg.sub import a\n")
    (pkg / "c.py").write_text("from . import sub\nfrom pkg.sub.a import f\nimport os\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert graph == {"pkg": set(), "pkg.sub": {"pkg.sub.a"}, "pkg.sub.a": {"pkg.b", "pkg.c"},
                     "pkg.b": {"pkg.sub.a"}, "pkg.c": {"pkg.sub", "pkg.sub.a"}}
    assert cycles(graph) == [["pkg.b", "pkg.sub.a", "pkg.b"]]


@pytest.mark.parametrize("edges, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, [["a", "b", "c", "a"]]),
    ({"a": {"b", "c"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}, [["c", "d", "c"], ["a", "b", "a"]]),
])
def test_cycles(edges, expected):
    assert cycles(edges) == expected
