"""The house's layout rules (docs/DESIGN.md), checked on the import graph of the project's own modules.

Every .py file of the project is parsed with ast; every import counts, including those inside functions (a lazy
import is still a dependency). The rules:
- no import circle among the project's modules;
- streamlit only in app.py and views/ (core and diagnostics run in the CLI and in tests without a browser);
- no import from a lower layer to a higher one (LAYERS, top first); within core, feature packages do not import
  each other (each mirrors one page).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "views", "diagnostics", "core")  # the product; bench/ and tests/ sit outside the layers
STREAMLIT_ALLOWED = ("app", "views")

# Top to bottom. A module belongs to the first layer with a prefix it starts with; a module may import its own layer
# and any layer below it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("pages", ("app", "views")),
    ("checklist and CLI", ("diagnostics",)),
    ("core feature packages", ("core.compare", "core.long_context", "core.deployment", "core.monitor", "core.fleet",
                               "core.quality")),
    ("engines and telemetry", ("core.engines", "core.telemetry")),
    ("core basics", ("core",)),
]
FEATURES = LAYERS[2][1]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _project_files() -> dict[str, Path]:
    files = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).parts
        if rel[0].startswith(".") or rel[0] not in PACKAGES + ("app.py",):
            continue
        files[_module_name(path)] = path
    return files


def _imports(path: Path, module: str) -> set[str]:
    """Dotted names this file imports; `from a import b` yields a.b, which _graph() cuts back to a when b is not a
    module (so importing a submodule does not count as importing its package's __init__)."""
    out: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.update(f"{name}.{alias.name}" for alias in node.names)  # a submodule, or a name inside `name`
    return out


def _graph() -> dict[str, set[str]]:
    files = _project_files()
    graph = {}
    for module, path in files.items():
        targets = set()
        for name in _imports(path, module):
            while name and name not in files:  # a.b.func -> a.b: `from a.b import func` imports a.b
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def _layer(module: str) -> int:
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def _feature(module: str) -> str | None:
    return next((p for p in FEATURES if module == p or module.startswith(p + ".")), None)


def test_the_graph_sees_the_project():
    graph = _graph()
    assert {"app", "views.model", "diagnostics.runner", "core.engines.pool", "core.fmt"} <= set(graph)
    assert "core.errors" in graph["core.http"]  # imports at module level and inside functions both count
    assert "core.engines.factory" in graph["core.engines.pool"]


def test_no_import_circles():
    graph = _graph()
    # Packages import their own __init__ implicitly; only explicit imports between modules make a circle.
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_streamlit_only_in_app_and_views():
    offenders = []
    for module, path in _project_files().items():
        if module.split(".")[0] in STREAMLIT_ALLOWED:
            continue
        if any(name == "streamlit" or name.startswith("streamlit.") for name in _imports(path, module)):
            offenders.append(module)
    assert not offenders, f"streamlit imported outside app.py and views/: {offenders}"


def test_no_import_climbs_a_layer():
    upward = []
    for module, targets in _graph().items():
        for target in targets:
            if _layer(target) < _layer(module):
                upward.append(f"{module} ({LAYERS[_layer(module)][0]}) imports {target} ({LAYERS[_layer(target)][0]})")
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(sorted(upward))


def test_feature_packages_do_not_import_each_other():
    sideways = []
    for module, targets in _graph().items():
        mine = _feature(module)
        sideways += [f"{module} imports {t}" for t in targets if mine and _feature(t) not in (None, mine)]
    assert not sideways, "feature packages importing each other:\n" + "\n".join(sorted(sideways))
