"""The house's layout rules (docs/DESIGN.md), checked on the import graph of the project's own modules.

Every .py file of the project is parsed with ast; every import counts, including those inside functions (a lazy
import is still a dependency). The rules:
- no import circle among the project's modules;
- streamlit only in app.py and views/ (core and diagnostics run in the CLI and in tests without a browser);
- no import from a lower layer to a higher one (LAYERS, top first); within core, feature packages do not import
  each other (each mirrors one page);
- every top-level folder with Python in it is in a layer or named as outside the product (OUTSIDE);
- the product never imports bench/ or tests/;
- bench/ imports no streamlit and does not edit sys.path (it runs as `python -m bench.NAME` from the checkout);
- core basics import no torch, triton or pynvml at module level (importing core stays cheap and GPU-free);
- a page (views/*.py) is at most PAGE_LINES lines: it reads widgets, makes one call and renders; what it draws at
  length lives in views/common/;
- above the engines (features, the checklist and CLI, pages), core.engines is entered only by its doors (ENGINE_DOORS);
  telemetry is a layer below the engines.
Each rule is a function of a root folder, so tests/unit/test_layout.py also shows each one failing on a made-up tree.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "views", "diagnostics", "core")  # the product
OUTSIDE = ("bench", "tests", "scripts", "docs")  # code beside the product, never imported by it
HEAVY = ("torch", "triton", "pynvml")  # what core basics may import only inside functions
STREAMLIT_ALLOWED = ("app", "views")
PAGE_LINES = 200  # docs/DESIGN.md: pages stay thin

# Top to bottom. A module belongs to the first layer with a prefix it starts with; a module may import its own layer
# and any layer below it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("pages", ("app", "views")),
    ("checklist and CLI", ("diagnostics",)),
    ("core feature packages", ("core.compare", "core.long_context", "core.deployment", "core.monitor", "core.fleet",
                               "core.quality")),
    ("engines", ("core.engines",)),
    ("telemetry", ("core.telemetry",)),
    ("core basics", ("core",)),
]
FEATURES = LAYERS[2][1]
# What code above the engines may import from core.engines: the protocol and its data, the one place engines are
# built, the pool, the remote client, the in-process engines' shared part, the device and memory helpers.
ENGINE_DOORS = ("core.engines.base", "core.engines.factory", "core.engines.pool", "core.engines.remote",
                "core.engines.hf_side", "core.engines.device", "core.engines")
DOOR_EXCEPTIONS: set[tuple[str, str]] = set()  # (importer, engine module) pairs allowed past the doors: none


def _project_files(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    files = {}
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).parts
        if rel[0].startswith(".") or rel[0] not in packages + (("app.py",) if "app" in packages else ()):
            continue
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
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


def _graph(root: Path = ROOT) -> dict[str, set[str]]:
    files = _project_files(root)
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


def upward_imports(root: Path = ROOT) -> list[str]:
    upward = []
    for module, targets in _graph(root).items():
        for target in targets:
            if _layer(target) < _layer(module):
                upward.append(f"{module} ({LAYERS[_layer(module)][0]}) imports {target} ({LAYERS[_layer(target)][0]})")
    return sorted(upward)


def engine_side_doors(root: Path = ROOT) -> list[str]:
    """Imports of core.engines modules other than its doors, from the layers above the engines."""
    engines = _layer("core.engines")
    return sorted(f"{module} imports {target}" for module, targets in _graph(root).items()
                  if _layer(module) < engines for target in targets
                  if _layer(target) == engines and target not in ENGINE_DOORS
                  and (module, target) not in DOOR_EXCEPTIONS)


def test_no_import_climbs_a_layer():
    assert not upward_imports(), "imports from a lower layer to a higher one:\n" + "\n".join(upward_imports())


def test_features_pages_and_the_cli_enter_the_engines_by_their_doors():
    assert not engine_side_doors(), "use core.engines.{base,factory,pool,remote,hf_side,device}:\n" + "\n".join(
        engine_side_doors())


def test_feature_packages_do_not_import_each_other():
    sideways = []
    for module, targets in _graph().items():
        mine = _feature(module)
        sideways += [f"{module} imports {t}" for t in targets if mine and _feature(t) not in (None, mine)]
    assert not sideways, "feature packages importing each other:\n" + "\n".join(sorted(sideways))


# ---- the rules that keep the house's edges (each shown failing on a made-up tree below) -------------------------

def unplaced_folders(root: Path = ROOT) -> list[str]:
    """Top-level folders holding Python that are neither product packages nor named as outside it."""
    folders = {p.relative_to(root).parts[0] for p in root.rglob("*.py") if len(p.relative_to(root).parts) > 1}
    return sorted(f for f in folders if not f.startswith(".") and f not in PACKAGES + OUTSIDE)


def product_imports_of_outside(root: Path = ROOT) -> list[str]:
    return sorted(f"{module} imports {name}" for module, path in _project_files(root).items()
                  for name in _imports(path, module) if name.split(".")[0] in ("bench", "tests"))


def _touches_sys_path(tree: ast.AST) -> bool:
    return any(isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
               and node.value.id == "sys" for node in ast.walk(tree))


def bench_offences(root: Path = ROOT) -> list[str]:
    out = []
    for module, path in _project_files(root, ("bench",)).items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        if any(n.split(".")[0] == "streamlit" for n in _imports(path, module)):
            out.append(f"{module} imports streamlit")
        if _touches_sys_path(tree):
            out.append(f"{module} edits sys.path")
    return sorted(out)


def _module_level_imports(nodes) -> list[str]:
    """Names imported when the module is imported: its body, and if/try blocks in it, not functions or classes."""
    names = []
    for node in nodes:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.append(node.module or "")
        elif isinstance(node, (ast.If, ast.Try)):
            names += _module_level_imports(node.body + node.orelse + getattr(node, "finalbody", []))
            for handler in getattr(node, "handlers", []):
                names += _module_level_imports(handler.body)
    return names


def heavy_basics(root: Path = ROOT) -> list[str]:
    out = []
    for module, path in _project_files(root).items():
        if _layer(module) != len(LAYERS) - 1:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        out += [f"{module} imports {n} at module level" for n in _module_level_imports(tree.body)
                if n.split(".")[0] in HEAVY]
    return sorted(out)


def long_pages(root: Path = ROOT) -> list[str]:
    """Pages over PAGE_LINES lines, counted as `wc -l` counts them (blank lines and comments too); views/common/
    holds no pages."""
    counts = {p.relative_to(root).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
              for p in (root / "views").glob("*.py")}
    return sorted(f"{page} has {n} lines" for page, n in counts.items() if n > PAGE_LINES)


def test_every_top_level_folder_has_a_place():
    assert not unplaced_folders(), f"top-level folders in no layer (add them to PACKAGES and LAYERS, or OUTSIDE): " \
                                   f"{unplaced_folders()}"


def test_the_product_never_imports_bench_or_tests():
    assert not product_imports_of_outside(), product_imports_of_outside()


def test_bench_runs_without_streamlit_or_sys_path_edits():
    assert not bench_offences(), bench_offences()


def test_core_basics_import_no_torch_triton_or_pynvml_at_module_level():
    assert not heavy_basics(), "move the module under core/engines/ or import lazily:\n" + "\n".join(heavy_basics())


def test_every_page_is_at_most_200_lines():
    assert not long_pages(), f"move a panel or a render helper into views/common/: {long_pages()}"


def test_each_rule_fails_on_a_tree_that_breaks_it(tmp_path):
    files = {
        "app.py": "",
        "core/__init__.py": "",
        "core/fmt.py": "import torch\nfrom tests.fakes import nvml\n\ndef f():\n    import triton\n",
        "core/engines/__init__.py": "import torch\n",  # engines may
        "bench/probe.py": "import sys\nsys.path.insert(0, 'x')\nfrom streamlit.proto import ForwardMsg_pb2\n",
        "cli/__init__.py": "import streamlit\n",
        # the two imports the 2026-12-06 review injected into a copy of main, which every rule then let through
        "core/telemetry/__init__.py": "",
        "core/telemetry/base.py": "from core.engines.torch.engine import current_device\n",
        "core/engines/torch/__init__.py": "",
        "core/engines/torch/engine.py": "",
        "core/engines/fast/__init__.py": "",
        "core/engines/fast/kernels/__init__.py": "",
        "core/engines/fast/kernels/int_gemv.py": "",
        "core/engines/base.py": "",
        "core/compare/__init__.py": "",
        "core/compare/run.py": "from core.engines.fast.kernels.int_gemv import gemv_linear\nfrom core.engines import base\n",
        "views/long.py": "x = 1\n" * (PAGE_LINES + 1),
        "views/thin.py": "x = 1\n" * PAGE_LINES,
        "views/common/long_view.py": "x = 1\n" * (PAGE_LINES + 1),  # a helper, not a page
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert unplaced_folders(tmp_path) == ["cli"]
    assert product_imports_of_outside(tmp_path) == ["core.fmt imports tests.fakes.nvml"]
    assert bench_offences(tmp_path) == ["bench.probe edits sys.path", "bench.probe imports streamlit"]
    assert heavy_basics(tmp_path) == ["core.fmt imports torch at module level"]  # triton inside a function is fine
    assert upward_imports(tmp_path) == ["core.telemetry.base (telemetry) imports core.engines.torch.engine (engines)"]
    assert engine_side_doors(tmp_path) == ["core.compare.run imports core.engines.fast.kernels.int_gemv"]
    assert long_pages(tmp_path) == [f"views/long.py has {PAGE_LINES + 1} lines"]


def test_a_precision_is_named_in_four_product_files():
    """Adding a precision touches core/precision.py, its fast-engine method, its kernel module (the weight format)
    and its quantizer: no other product file names one (INT4 AWQ, the newest, stands for them all)."""
    named = sorted(str(p.relative_to(ROOT)) for m, p in _project_files().items()
                   if "int4-awq" in p.read_text(encoding="utf-8") or "INT4_AWQ" in p.read_text(encoding="utf-8"))
    assert named == ["core/engines/fast/int_weight.py", "core/engines/fast/methods/integer.py",
                     "core/engines/torch/quant.py", "core/precision.py"], named
