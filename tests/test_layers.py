"""The package's folders are its layers (docs/architecture.md, "Layers"): a module imports only from its own
layer or below, and no two modules import each other, directly or round a circle.

Every import counts: at module level, inside a function, under `if TYPE_CHECKING:`. A lazy import
still ties the two modules together; it only hides the tie from a reader.

`LAYERS` is the specification, bottom to top. A module belongs to the layer of the longest
prefix that names it (`vime.engine.weight_sync.sync` to `vime.engine`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOTS = ("vime", "workflows", "activities", "workers")

LAYERS: list[tuple[str, ...]] = [
    # vime/: the library, from the ground up
    ("vime.types", "vime.errors", "vime.log", "vime.cache", "vime.aio"),
    # plumbing every layer may use: hooks by dotted path, child processes, the run directory,
    # --vllm-*/--router-* forwarding (the engine's topology reads it), metrics and sample lines
    ("vime.plugins", "vime.procguard", "vime.procs", "vime.rundir", "vime.config.forward", "vime.config.vllm_options",
     "vime.metrics_log", "vime.metrics", "vime.sample_summary"),
    ("vime.store",),
    ("vime.engine", "vime.router"),
    ("vime.sandbox",),
    ("vime.rollout",),
    ("vime.agent",),
    ("vime.train", "vime.testing"),
    ("vime.temporal",),
    ("vime.envs",),
    # vime/config/: flags parsed and checked against everything below (but its two modules that
    # the engine's topology reads, placed with the plumbing above)
    ("vime.config",),
    # vime/launcher/: `vime train` and `vime smoke`
    ("vime.launcher",),
    ("vime.ops",),
    ("vime.cli", "vime"),  # "vime" is the package's __init__ only: a new module must be placed
    # above the library
    ("workflows",),
    ("activities",),
    ("workers",),
]



@dataclass(frozen=True)
class Import:
    importer: str  # module name
    path: str  # file, relative to the repository
    line: int
    imported: str  # module name


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files() -> dict[str, Path]:
    return {module_name(p): p for root in ROOTS for p in sorted((REPO / root).rglob("*.py"))}


def imports(modules: dict[str, Path]) -> list[Import]:
    """Every import of one of our modules, wherever it stands in the file. `from pkg import name`
    imports `pkg.name` when that is a module, else `pkg`."""
    found = []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        rel = str(path.relative_to(REPO))
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:  # `import a.b.c` where c is a class: a.b
                    target = target.rpartition(".")[0]
                if target and target != name and target.split(".")[0] in ROOTS:
                    found.append(Import(name, rel, node.lineno, target))
    return sorted(set(found), key=lambda i: (i.path, i.line, i.imported))


def layer_of(module: str) -> int:
    best, level = -1, None
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            covers = module == prefix or (module.startswith(prefix + ".") and prefix != "vime")
            if covers and len(prefix) > best:
                best, level = len(prefix), i
    assert level is not None, f"{module} is in no layer: add it to LAYERS in {__file__}"
    return level


def cycles(edges: list[Import]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.importer, set()).add(e.imported)
        graph.setdefault(e.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
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
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_every_module_has_a_layer():
    for module in source_files():
        layer_of(module)


def test_no_import_cycle():
    edges = imports(source_files())
    found = cycles(edges)
    detail = []
    for component in found:
        members = set(component)
        detail.append(" <-> ".join(component) + "\n" + "\n".join(
            f"    {e.path}:{e.line} imports {e.imported}" for e in edges
            if e.importer in members and e.imported in members))
    assert not found, "import cycles (break each: move what both need below both):\n" + "\n".join(detail)


def test_no_module_imports_from_a_higher_layer():
    upward = [e for e in imports(source_files()) if layer_of(e.imported) > layer_of(e.importer)]
    assert not upward, "imports from a higher layer (see LAYERS in tests/test_layers.py):\n" + "\n".join(
        f"  {e.path}:{e.line} imports {e.imported} (layer {layer_of(e.imported)} > {layer_of(e.importer)})"
        for e in upward)
