"""The import graph of ``cadence/``: no cycles, and every clause of the dependency rule of
``docs/architecture.md`` holds (its layer table is read from the page itself; each clause
names the test below that checks it).

The graph is read from the source with :mod:`ast`, nothing is imported. What counts as an
edge ``a -> b`` (module ``a`` executes module ``b``):

- ``import x.y.z`` and ``from x.y import z`` anywhere in ``a``: at module level, inside
  functions and classes (a function-local import runs when the function is called, and a
  cycle through it is only postponed), inside ``try``/``if`` blocks. The body of
  ``if TYPE_CHECKING:`` is left out (it never runs); its ``else:`` branch counts.
- ``from pkg import name`` counts as an edge to ``pkg`` and, when ``pkg.name`` is a module,
  to ``pkg.name``; when ``pkg/__init__.py`` re-exports ``name`` lazily
  (:func:`cadence._lazy.lazy_exports` with a literal ``{"name": "defining.module"}`` table),
  to the defining module too, since reading the name imports it.
- Importing ``a.b.c`` also executes the packages ``a`` and ``a.b``: edges to those parent
  packages' ``__init__`` are added, except to packages that contain the importing module
  itself. Python runs a module's own parent packages before the module, so they are already
  in ``sys.modules`` (partly initialised while their ``__init__`` imports a submodule); an
  edge back to them would report every ``pkg/__init__.py`` that imports its own submodule
  as a cycle, a false one. An explicit ``from pkg import name`` of an enclosing package
  still counts (it reads a name from a package that may not be initialised yet).
- Relative imports are resolved against the importing module's package.

The package graph: one node per package (``cadence.core``) or top-level module
(``cadence.cli``); the Composer facades of the rule (``cadence.utils.checkpoint``, ...) are
nodes of their own, in the layer the page gives them. A package ``__init__``'s lazy table is
not an edge of the package itself (it imports nothing until a name is read); importing a
lazily re-exported name from it is an edge to the defining module.

Not seen: ``importlib.import_module`` with a computed name (the registry's dotted paths, the
lazy tables' own look-ups) and attribute chains such as ``cadence.core.State`` after a bare
``import cadence``.
"""

from __future__ import annotations

import ast
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Optional

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "cadence"

ARCHITECTURE = REPO / "docs" / "architecture.md"
#: ``cadence.core`` imports nothing else from cadence but ``cadence._lazy``, the
#: standard-library-only helper behind every package ``__init__``'s lazy re-exports.
CORE_ALLOWED = frozenset({"cadence._lazy"})
#: Plug-ins never import the Trainer.
PLUGIN_PACKAGES = ("cadence.algorithms", "cadence.callbacks", "cadence.loggers",
                   "cadence.models", "cadence.profiler")
#: Modules the run file's first, torch-free check reads: standard library only at module
#: level (their function-local imports of torch run in the second stage or at use).
STANDARD_LIBRARY_ONLY = ("cadence._lazy", "cadence._version", "cadence.registry",
                         "cadence.parallel.config", "cadence.parallel.compile_config",
                         "cadence.parallel.tp_styles", "cadence.parallel.pipeline_config",
                         "cadence.launch.slurm",
                         "cadence.launch.restarts")


# ----------------------------------------------------------------------------- the graph
@dataclass(frozen=True)
class ImportEdge:
    """One import statement's effect: ``source`` executes ``target`` (line ``line``)."""

    source: str
    target: str
    line: int


def module_name(path: Path, root: Path) -> str:
    """``root/cadence/core/time.py`` -> ``cadence.core.time``; a package's ``__init__.py``
    is the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def find_modules(package_dir: Path) -> dict[str, Path]:
    """Every module under ``package_dir`` (a package folder), by dotted name."""
    root = package_dir.parent
    return {module_name(path, root): path for path in sorted(package_dir.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING`` (an ``if`` whose body never runs)."""
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` except those inside the body of ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            stack.append(node.test)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _resolve_relative(module: Optional[str], level: int, source: str, is_package: bool) -> str:
    """The absolute name of ``from <level dots><module> import ...`` inside ``source``."""
    if level == 0:
        return module or ""
    base = source.split(".") if is_package else source.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def lazy_table(tree: ast.AST) -> dict[str, str]:
    """A package ``__init__``'s lazy re-exports: ``{"Name": "defining.module"}`` from the
    literal string entries of the dict passed to ``lazy_exports`` (directly or through a
    module-level name); ``**`` entries and computed keys are skipped."""
    dicts: dict[str, ast.Dict] = {}
    for node in ast.walk(tree):
        if (isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    dicts[target.id] = node.value
    table: dict[str, str] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and len(node.args) >= 2
                and getattr(node.func, "id", getattr(node.func, "attr", None)) == "lazy_exports"):
            continue
        mapping = node.args[1]
        if isinstance(mapping, ast.Name):
            mapping = dicts.get(mapping.id)
        if not isinstance(mapping, ast.Dict):
            continue
        for key, value in zip(mapping.keys, mapping.values):
            if (isinstance(key, ast.Constant) and isinstance(key.value, str)
                    and isinstance(value, ast.Constant) and isinstance(value.value, str)):
                table[key.value] = value.value
    return table


def _parents(name: str) -> list[str]:
    """``a.b.c`` -> ``["a", "a.b"]``."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_edges(modules: Mapping[str, Path], prefix: str = "cadence") -> list[ImportEdge]:
    """Every edge between the modules of ``modules`` (see the module docstring)."""
    trees = {name: ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
             for name, path in modules.items()}
    lazy = {name: lazy_table(tree) for name, tree in trees.items()
            if modules[name].name == "__init__.py"}
    edges: list[ImportEdge] = []
    for source, tree in trees.items():
        own_packages = set(_parents(source))
        is_package = modules[source].name == "__init__.py"
        if is_package:
            own_packages.add(source)

        def add(target: str, line: int, source: str = source,
                own_packages: set[str] = own_packages) -> None:
            """``source`` runs ``target`` (named explicitly: counts even when it encloses
            ``source``) and ``target``'s parent packages (except ``source``'s own)."""
            if target == source or target not in modules:
                return
            edges.append(ImportEdge(source, target, line))
            for parent in _parents(target):  # executing a.b.c runs a and a.b first
                if parent in modules and parent not in own_packages:
                    edges.append(ImportEdge(source, parent, line))

        for node in runtime_nodes(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == prefix or alias.name.startswith(prefix + "."):
                        add(alias.name, node.lineno)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve_relative(node.module, node.level, source, is_package)
                if not (base == prefix or base.startswith(prefix + ".")):
                    continue
                add(base, node.lineno)
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    if submodule in modules:
                        add(submodule, node.lineno)
                    elif alias.name in lazy.get(base, {}):
                        add(lazy[base][alias.name], node.lineno)
    return edges


def graph_of(edges: Iterable[ImportEdge]) -> dict[str, set[str]]:
    """``{module: {modules it imports}}``."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
    return graph


def strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one node, or one node with an
    edge to itself; each sorted, the list sorted (iterative, no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    nodes = sorted(set(graph) | {t for targets in graph.values() for t in targets})
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    components.append(sorted(component))
    return sorted(components)


def shortest_cycle(graph: Mapping[str, Iterable[str]], component: list[str]) -> list[str]:
    """One shortest cycle through the component's first module, as ``[a, b, ..., a]``
    (breadth-first inside the component)."""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph.get(node, ())):
                if child not in members:
                    continue
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start,
                                                                                       start]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    return [start, start]


def describe_cycles(edges: list[ImportEdge]) -> list[str]:
    """One line per import cycle: ``a -> b -> a`` and, for each arrow, the line of the
    import (``a:12``)."""
    graph = graph_of(edges)
    lines_of = {}
    for edge in edges:
        lines_of.setdefault((edge.source, edge.target), edge.line)
    out = []
    for component in strongly_connected(graph):
        cycle = shortest_cycle(graph, component)
        where = ", ".join(f"{a}:{lines_of[(a, b)]}" for a, b in zip(cycle, cycle[1:]))
        extra = f" (one cycle of a tangle of {len(component)} modules)" \
            if len(component) > len(cycle) - 1 else ""
        out.append(f"{' -> '.join(cycle)}   [import at {where}]{extra}")
    return out


@pytest.fixture(scope="module")
def cadence_edges() -> list[ImportEdge]:
    """The edges of the real tree."""
    return import_edges(find_modules(PACKAGE))


# ----------------------------------------------------------------------------- the real tree
def test_there_are_modules_to_check(cadence_edges: list[ImportEdge]) -> None:
    modules = find_modules(PACKAGE)
    assert {"cadence", "cadence.core.event", "cadence.trainer.trainer"} <= set(modules)
    assert len(cadence_edges) > 100  # the parser sees the tree's imports


def test_no_import_cycles(cadence_edges: list[ImportEdge]) -> None:
    cycles = describe_cycles(cadence_edges)
    assert not cycles, "import cycles under cadence/ (function-local imports count):\n" + \
        "\n".join(cycles)


def test_core_imports_nothing_else_from_cadence(cadence_edges: list[ImportEdge]) -> None:
    bad = [f"{e.source}:{e.line} imports {e.target}" for e in cadence_edges
           if _inside(e.source, "cadence.core") and not _inside(e.target, "cadence.core")
           and e.target != "cadence" and e.target not in CORE_ALLOWED]
    assert not bad, "cadence/core must import nothing else from cadence:\n" + "\n".join(bad)


def test_core_allowance_imports_nothing_from_cadence(cadence_edges: list[ImportEdge]) -> None:
    bad = [f"{e.source}:{e.line} imports {e.target}" for e in cadence_edges
           if e.source in CORE_ALLOWED]
    assert not bad, "\n".join(bad)


def test_plugins_never_import_the_trainer(cadence_edges: list[ImportEdge]) -> None:
    bad = [f"{e.source}:{e.line} imports {e.target}" for e in cadence_edges
           if any(_inside(e.source, p) for p in PLUGIN_PACKAGES)
           and (_inside(e.target, "cadence.trainer") or _inside(e.target, "cadence.config"))]
    assert not bad, ("algorithms/, callbacks/, loggers/, models/ and profiler/ must not import "
                     "cadence.trainer or cadence.config (they register through "
                     "cadence.registry):\n" + "\n".join(bad))


def test_models_import_nothing_from_torch_distributed() -> None:
    modules = {n: p for n, p in find_modules(PACKAGE).items() if _inside(n, "cadence.models")}
    bad = []
    for name, path in modules.items():
        bad += [f"{name}:{line} {what}" for line, what in torch_distributed_uses(path)]
    assert not bad, ("model files must use nothing from torch.distributed (parallelism is "
                     "applied from outside, cadence/parallel):\n" + "\n".join(bad))


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def torch_distributed_uses(path: Path) -> list[tuple[int, str]]:
    """Imports of ``torch.distributed`` (``import torch.distributed...``, ``from
    torch.distributed... import``, ``from torch import distributed``) and attribute chains
    ``torch.distributed`` in ``path``, outside ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in runtime_nodes(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names
                      if _inside(a.name, "torch.distributed")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _inside(node.module, "torch.distributed") or (
                    node.module == "torch" and any(a.name == "distributed" for a in node.names)):
                found.append((node.lineno, f"from {node.module} import ..."))
        elif (isinstance(node, ast.Attribute) and node.attr == "distributed"
              and isinstance(node.value, ast.Name) and node.value.id == "torch"):
            found.append((node.lineno, "torch.distributed"))
    return sorted(found)


# ----------------------------------------------------------------------------- the layers
def rule_section(text: str) -> str:
    """The "The dependency rule" section of ``docs/architecture.md``."""
    start = text.index("## The dependency rule")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def layer_table(section: str) -> dict[str, int]:
    """``{node: layer}`` from the rule's table: rows ``| N | `core/`, `utils/checkpoint.py`
    | ... |``; a folder ``x/`` is the package ``cadence.x``, ``x.py`` / ``x/y.py`` the module,
    ``__init__.py`` the top-level package ``cadence``."""
    layers: dict[str, int] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].isdigit():
            continue
        for path in re.findall(r"`([^`]+)`", cells[1]):
            if path == "__init__.py":
                node = "cadence"
            else:
                node = "cadence." + path.rstrip("/").removesuffix(".py").replace("/", ".")
            assert node not in layers, f"{path} is in two layers"
            layers[node] = int(cells[0])
    return layers


def node_of(module: str, layers: Mapping[str, int]) -> str:
    """The package-graph node of ``module``: itself when the table names it (a facade or a
    top-level module), else its package ``cadence.x``."""
    if module in layers:
        return module
    parts = module.split(".")
    return ".".join(parts[:2])


def package_edges(edges: Iterable[ImportEdge], layers: Mapping[str, int]
                  ) -> dict[tuple[str, str], ImportEdge]:
    """``{(node, node): one import behind it}`` between different nodes; an import of the
    top-level package ``cadence`` itself (its lazy face) is left out."""
    out: dict[tuple[str, str], ImportEdge] = {}
    for edge in edges:
        if edge.target == "cadence":
            continue
        a, b = node_of(edge.source, layers), node_of(edge.target, layers)
        if a != b:
            out.setdefault((a, b), edge)
    return out


@pytest.fixture(scope="module")
def rule() -> str:
    return rule_section(ARCHITECTURE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def layers(rule: str) -> dict[str, int]:
    return layer_table(rule)


def test_every_clause_names_its_test(rule: str) -> None:
    """The rule's clauses each name the test here that checks it, and every such test
    exists (the page and this file cannot drift apart)."""
    named = set(re.findall(r"`(test_[a-z_]+)`", rule))
    assert len(named) >= 8, named
    missing = sorted(name for name in named if name not in globals())
    assert not missing, f"docs/architecture.md names tests that do not exist: {missing}"


def test_every_package_has_one_layer(layers: dict[str, int]) -> None:
    nodes = {node_of(m, layers) for m in find_modules(PACKAGE)}
    assert nodes - set(layers) == set(), "packages the layer table does not place"
    assert set(layers) - nodes == set(), "the layer table names what does not exist"


def test_each_layer_imports_only_lower_layers(cadence_edges: list[ImportEdge],
                                              layers: dict[str, int]) -> None:
    bad = [f"{a} (layer {layers[a]}) imports {b} (layer {layers[b]}) at "
           f"{edge.source}:{edge.line}"
           for (a, b), edge in sorted(package_edges(cadence_edges, layers).items())
           if layers[b] >= layers[a]]
    assert not bad, "imports that are not downward in the layer table:\n" + "\n".join(bad)


def test_no_package_cycles(cadence_edges: list[ImportEdge], layers: dict[str, int]) -> None:
    graph: dict[str, set[str]] = {}
    for a, b in package_edges(cadence_edges, layers):
        graph.setdefault(a, set()).add(b)
    cycles = [" -> ".join(shortest_cycle(graph, c)) for c in strongly_connected(graph)]
    assert not cycles, "package cycles under cadence/:\n" + "\n".join(cycles)


def test_launch_imports_nothing_from_cadence(cadence_edges: list[ImportEdge]) -> None:
    bad = [f"{e.source}:{e.line} imports {e.target}" for e in cadence_edges
           if _inside(e.source, "cadence.launch") and not _inside(e.target, "cadence.launch")]
    assert not bad, "\n".join(bad)


def test_early_check_modules_import_only_the_standard_library() -> None:
    modules = {n: p for n, p in find_modules(PACKAGE).items()
               if any(_inside(n, m) for m in STANDARD_LIBRARY_ONLY)}
    bad = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:  # module level only
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0
                     else [])
            for imported in names:
                top = imported.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("cadence", "__future__"):
                    bad.append(f"{name}:{node.lineno} imports {imported}")
    assert not bad, "\n".join(bad)


# ----------------------------------------------------------------------------- the checker
def _package(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return find_modules(tmp_path / "cadence")


def test_checker_finds_a_cycle_through_a_function_local_import(tmp_path: Path) -> None:
    modules = _package(tmp_path, {
        "cadence/__init__.py": "",
        "cadence/a.py": "from cadence.b import thing\n",
        "cadence/b.py": "def thing():\n    from cadence import a\n    return a\n",
    })
    assert describe_cycles(import_edges(modules)) == [
        "cadence.a -> cadence.b -> cadence.a   [import at cadence.a:1, cadence.b:2]"]


def test_checker_skips_type_checking_but_not_its_else(tmp_path: Path) -> None:
    modules = _package(tmp_path, {
        "cadence/__init__.py": "",
        "cadence/a.py": "from typing import TYPE_CHECKING\nimport cadence.b\n",
        "cadence/b.py": ("import typing\nif typing.TYPE_CHECKING:\n    import cadence.a\n"
                         "else:\n    import cadence.c\n"),
        "cadence/c.py": "",
    })
    graph = graph_of(import_edges(modules))
    assert graph["cadence.b"] == {"cadence.c"}
    assert not strongly_connected(graph)


def test_checker_counts_parent_packages_and_lazy_exports(tmp_path: Path) -> None:
    modules = _package(tmp_path, {
        "cadence/__init__.py": "",
        "cadence/_lazy.py": "",
        "cadence/core/__init__.py": (
            "from cadence._lazy import lazy_exports\n"
            "import cadence.core.state\n"  # a package importing its own module: no cycle
            "_LAZY = {'Thing': 'cadence.other.thing'}\n"
            "__getattr__, __dir__ = lazy_exports(__name__, _LAZY)\n"),
        "cadence/core/state.py": "from cadence.core.time import Time\n",
        "cadence/core/time.py": "Time = int\n",
        "cadence/other/__init__.py": "from cadence.core import Thing\n",
        "cadence/other/thing.py": "from .. import core\n",
    })
    edges = import_edges(modules)
    graph = graph_of(edges)
    assert "cadence.core" not in graph["cadence.core.state"]  # its own package: skipped
    assert graph["cadence.other"] >= {"cadence.core", "cadence.other.thing"}  # lazy name
    assert graph["cadence.other.thing"] == {"cadence", "cadence.core"}  # relative, resolved
    assert not describe_cycles(edges)


def test_checker_counts_an_explicit_import_of_the_enclosing_package(tmp_path: Path) -> None:
    """``from cadence.core import X`` inside ``cadence/core/state.py`` while
    ``core/__init__`` imports ``state``: a real cycle (``X`` may not be defined yet)."""
    modules = _package(tmp_path, {
        "cadence/__init__.py": "",
        "cadence/core/__init__.py": "from cadence.core.state import State\nX = 1\n",
        "cadence/core/state.py": "from cadence.core import X\nState = X\n",
    })
    assert describe_cycles(import_edges(modules)) == [
        "cadence.core -> cadence.core.state -> cadence.core   "
        "[import at cadence.core:1, cadence.core.state:1]"]


def test_checker_finds_a_package_cycle_and_an_upward_import(tmp_path: Path) -> None:
    """No module cycle, but packages ``a`` and ``b`` import each other: the package graph
    shows the cycle and the layer table the upward import."""
    modules = _package(tmp_path, {
        "cadence/__init__.py": "",
        "cadence/a/__init__.py": "",
        "cadence/a/x.py": "from cadence.b.y import thing\n",
        "cadence/a/w.py": "",
        "cadence/b/__init__.py": "",
        "cadence/b/y.py": "thing = 1\n",
        "cadence/b/z.py": "def f():\n    import cadence.a.w\n",
    })
    edges = import_edges(modules)
    assert not describe_cycles(edges)
    layers = layer_table("| Layer | Packages |\n|---|---|\n| 1 | `a/` |\n| 2 | `b/`, `cli.py` |\n")
    assert layers == {"cadence.a": 1, "cadence.b": 2, "cadence.cli": 2}
    pairs = package_edges(edges, layers)
    assert set(pairs) == {("cadence.a", "cadence.b"), ("cadence.b", "cadence.a")}
    graph = {"cadence.a": {"cadence.b"}, "cadence.b": {"cadence.a"}}
    assert strongly_connected(graph) == [["cadence.a", "cadence.b"]]
    assert pairs[("cadence.a", "cadence.b")].line == 1  # the upward import, a (1) -> b (2)


def test_checker_sees_torch_distributed(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("import torch\nfrom torch import distributed as d\n"
                    "def f():\n    import torch.distributed.tensor\n"
                    "    return torch.distributed.is_initialized()\n", encoding="utf-8")
    assert [line for line, _ in torch_distributed_uses(path)] == [2, 4, 5]


if __name__ == "__main__":  # python tests/test_import_cycles.py: print the cycles
    all_edges = import_edges(find_modules(PACKAGE))
    table = layer_table(rule_section(ARCHITECTURE.read_text(encoding="utf-8")))
    package_graph: dict[str, set[str]] = {}
    for source, target in package_edges(all_edges, table):
        package_graph.setdefault(source, set()).add(target)
    found = describe_cycles(all_edges) + [
        "package cycle: " + " -> ".join(shortest_cycle(package_graph, component))
        for component in strongly_connected(package_graph)]
    print("\n".join(found) or "no import cycles")
    sys.exit(1 if found else 0)
