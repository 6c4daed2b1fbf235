"""The import graph of the packages: nothing below imports what sits above it (infra <- preprocessing <- pgt <-
tune <- flows; inside pgt, its floors: settings <- network <- data <- tracking <- serving <- training), no module
imports itself back through others, and imports inside functions are only of the kinds ARCHITECTURE.md names.
Every import statement counts, those inside functions too."""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

from tests.conftest import PROJECT_ROOT

LAYERS = ("infra", "preprocessing", "pgt", "tune", "flows")  # bottom to top
# pgt's sub-packages: the network (and the settings every subsystem reads) below the subsystems that use it
# pgt's floors, bottom to top: each imports only from its own floor and those below it. The command line (pgt.cli,
# pgt.options) stands above them all.
PGT_FLOORS = (("pgt.config", "pgt.recipes"), ("pgt.network",), ("pgt.data",), ("pgt.tracking",), ("pgt.serving",),
              ("pgt.training",))
# what may be imported inside a function (ARCHITECTURE.md, rule 4): heavy optional dependencies, with what comes
# with them, and the project's modules that import one of them at their top
LAZY_KINDS = {
    "ray": {"ray", "grpc", "tune.scheduler"},
    "mlflow": {"mlflow", "pandas", "pgt.serving.mlflow_model"},
    "prefect": {"prefect"},
    "matplotlib": {"matplotlib", "PIL", "pgt.serving.explain"},
    "web server": {"fastapi", "starlette", "uvicorn"},
    "torch.compile": {"torch._dynamo"},
    "scikit-learn": {"sklearn", "preprocessing.fitted", "preprocessing.stages"},
}
LAZY = set().union(*LAZY_KINDS.values())
CLI_MODULES = {"pgt.cli", "tune.cli"}  # the command line loads what a command needs when it runs


def module_files(root: Path = PROJECT_ROOT) -> dict[str, Path]:
    """Every module of the packages, sub-packages included, by dotted name (a package's __init__ under the
    package's name)."""
    found = {}
    for package in LAYERS:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports_of(path: Path, module: str) -> list[tuple[str, bool]]:
    """(imported module, whether the statement sits inside a function) for every import statement of a file,
    with relative imports resolved; `from m import name` counts as m, and as m.name where that is a module."""
    tree = ast.parse(path.read_text())
    inside = {id(node) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
              for node in ast.walk(fn)}
    package = module if path.stem == "__init__" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in inside) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.append((base, id(node) in inside))
            found += [(f"{base}.{alias.name}", id(node) in inside) for alias in node.names]
    return found


def import_graph(root: Path = PROJECT_ROOT) -> dict[str, set[str]]:
    """module -> the project's modules it imports, at the top or inside functions."""
    modules = module_files(root)
    return {module: {name for name, _ in imports_of(path, module) if name in modules and name != module}
            for module, path in modules.items()}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        return exc.args[1]
    return None


def test_no_package_imports_one_above_it():
    wrong = [f"{module} imports {target}" for module, targets in import_graph().items() for target in targets
             if LAYERS.index(target.split(".")[0]) > LAYERS.index(module.split(".")[0])]
    assert wrong == []


def floor_of(module: str) -> int | None:
    """The floor (0: settings) a module of pgt sits on; None for the command line and anything outside pgt."""
    return next((i for i, floor in enumerate(PGT_FLOORS) for name in floor
                 if module == name or module.startswith(f"{name}.")), None)


def floor_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import, at the top or inside a function, of a higher floor of pgt than the importer's."""
    return [f"{module} imports {target}" for module, targets in graph.items() for target in targets
            if floor_of(module) is not None and floor_of(target) is not None and floor_of(target) > floor_of(module)]


def test_pgt_sub_packages_are_floors():
    """The network and the data import no subsystem; tracking imports neither serving nor training; serving does
    not import training."""
    assert floor_violations(import_graph()) == []


# the training loop and what it runs each epoch: it reports every epoch through one channel (on_epoch) and knows
# neither MLflow nor Ray; the run layer (pgt.training.run, pgt.training.ray_train) connects them
LOOP_MODULES = ("pgt.training.train", "pgt.training.state", "pgt.training.step", "pgt.training.finish",
                "pgt.training.batches", "pgt.training.loss", "pgt.training.worker")
TRACKING = ("mlflow", "ray", "pgt.tracking", "pgt.serving")


def loop_leaks(root: Path = PROJECT_ROOT) -> list[str]:
    """Imports of MLflow, Ray, tracking or serving by the loop's modules, or of the loop's modules' importers'
    registration by anyone but the run layer."""
    files = module_files(root)
    leaks = [f"{module} imports {name}" for module in LOOP_MODULES if module in files
             for name, _ in imports_of(files[module], module)
             if any(name == t or name.startswith(f"{t}.") for t in TRACKING)]
    leaks += [f"{module} imports register_model" for module, path in files.items()
              if module not in ("pgt.training.run", "pgt.tracking.registry")
              and "pgt.tracking.registry.register_model" in {name for name, _ in imports_of(path, module)}]
    return leaks


def test_the_loop_knows_neither_mlflow_nor_ray_and_one_module_registers():
    assert loop_leaks() == []


def test_every_module_sits_in_a_package_of_its_layer():
    """pgt holds no loose modules beyond its command line and its settings: each subsystem has its folder."""
    loose = {m for m, path in module_files().items() if m.count(".") == 1 and m.startswith("pgt.")
             and path.stem != "__init__"}
    assert loose == {"pgt.cli", "pgt.options", *PGT_FLOORS[0]}
    assert {m for m in module_files() if m.startswith("pgt.") and m.count(".") == 1} - loose == \
        {name for floor in PGT_FLOORS[1:] for name in floor}


def test_the_import_graph_has_no_cycle():
    assert cycle(import_graph()) is None


def needless_lazy_imports(root: Path = PROJECT_ROOT) -> list[str]:
    """Imports inside functions (outside the command line) of anything but the lazy kinds."""
    return [f"{path.relative_to(root)}: {name}" for module, path in module_files(root).items()
            if module not in CLI_MODULES for name, in_function in imports_of(path, module)
            if in_function and not any(name == lazy or name.startswith(f"{lazy}.") for lazy in LAZY)]


def test_imports_inside_functions_are_only_the_lazy_kinds():
    assert needless_lazy_imports() == []


def planted(tmp_path: Path, files: dict[str, str]) -> Path:
    """A tree of the packages holding `files` (path -> source): where the checks must see a violation."""
    for package in LAYERS:
        (tmp_path / package).mkdir()
    (tmp_path / "pgt" / "network").mkdir()
    for name, source in files.items():
        (tmp_path / name).write_text(source)
    return tmp_path


def test_the_checks_see_what_they_guard(tmp_path):
    """A cycle hidden in a function, a package importing one above it, and a needless lazy import are all seen."""
    planted(tmp_path, {"pgt/a.py": "from pgt import b\n", "pgt/b.py": "def f():\n    from pgt.a import g\n",
                       "preprocessing/c.py": "def f():\n    from tune.sweep import run_sweep\n    import json\n"})
    graph = import_graph(tmp_path)
    assert graph["pgt.a"] == {"pgt.b"} and graph["pgt.b"] == {"pgt.a"}
    assert set(cycle(graph)) == {"pgt.a", "pgt.b"}
    assert ("tune.sweep", True) in imports_of(tmp_path / "preprocessing" / "c.py", "preprocessing.c")
    assert set(needless_lazy_imports(tmp_path)) == {"preprocessing/c.py: tune.sweep", "preprocessing/c.py: tune.sweep.run_sweep",
                                                    "preprocessing/c.py: json", "pgt/b.py: pgt.a", "pgt/b.py: pgt.a.g"}
    (tmp_path / "pgt" / "b.py").write_text("def f():\n    import mlflow\n")
    assert cycle(import_graph(tmp_path)) is None
    (tmp_path / "pgt" / "network" / "m.py").write_text("from pgt.a import g\n")
    assert import_graph(tmp_path)["pgt.network.m"] == {"pgt.a"}
    for package, source in (("tracking", "def f():\n    from pgt.training import t\n"),
                            ("data", "from pgt.training.t import x\n"), ("tracking", "import pgt.serving.s\n")):
        (tmp_path / "pgt" / package).mkdir(exist_ok=True)
        for name in ("training", "serving"):
            (tmp_path / "pgt" / name).mkdir(exist_ok=True)
            for stem in ("t", "s"):
                (tmp_path / "pgt" / name / f"{stem}.py").write_text("x = 1\n")
        (tmp_path / "pgt" / package / "m.py").write_text(source)
        assert floor_violations(import_graph(tmp_path)) != [], source
        (tmp_path / "pgt" / package / "m.py").unlink()
    # the loop importing MLflow (inside a function) or the tracking package, and a second caller of register_model
    (tmp_path / "pgt" / "tracking" / "registry.py").write_text("def register_model():\n    pass\n")
    for module, source in (("pgt/training/train.py", "def f():\n    import mlflow\n"),
                           ("pgt/training/state.py", "from pgt.tracking.s import x\n"),
                           ("tune/sweep.py", "from pgt.tracking.registry import register_model\n")):
        (tmp_path / module).parent.mkdir(exist_ok=True)
        (tmp_path / module).write_text(source)
        assert loop_leaks(tmp_path) != [], module
        (tmp_path / module).unlink()


def test_pgt_tune_comes_from_the_tune_package_through_an_entry_point():
    from importlib.metadata import entry_points

    (command,) = entry_points(group="pgt.commands", name="tune")
    assert command.value == "tune.cli:tune"
    r = subprocess.run([sys.executable, "-m", "pgt.cli", "tune", "--help"], capture_output=True, text=True,
                       env={"COLUMNS": "200", "PATH": ""}, cwd=PROJECT_ROOT)
    assert r.returncode == 0 and "--objective" in r.stdout and "strict_acc@1" in r.stdout


def defined_names(path: Path) -> set[str]:
    """What a module defines at its top: functions, classes, assigned names."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names |= {name.id for name in ast.walk(target) if isinstance(name, ast.Name)}  # a, b = ...
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def borrowed_imports(root: Path = PROJECT_ROOT) -> list[str]:
    """`from project.module import name` where module does not define name (it re-exports an import)."""
    modules = module_files(root)
    files = [*modules.values(), *sorted((root / "tests").rglob("*.py")), *sorted((root / "benchmarks").glob("*.py"))]
    wrong = []
    for path in files:
        if not path.is_file():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
                defined = defined_names(modules[node.module])
                wrong += [f"{path.relative_to(root)}: {node.module}.{alias.name}" for alias in node.names
                          if alias.name not in defined and f"{node.module}.{alias.name}" not in modules]
    return wrong


def test_every_name_is_imported_from_the_module_that_defines_it():
    assert borrowed_imports() == []


def test_a_re_export_is_seen(tmp_path):
    planted(tmp_path, {"pgt/a.py": "X = 1\n", "pgt/b.py": "from pgt.a import X\n",
                       "pgt/c.py": "from pgt.b import X\nfrom pgt.a import X as Y\n"})
    assert borrowed_imports(tmp_path) == ["pgt/c.py: pgt.b.X"]
