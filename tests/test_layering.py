"""Nothing below imports what sits above it: preprocessing <- pgt <- tune <- flows (benchmarks and scripts
on top). Every import statement counts, those inside functions too."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.conftest import PROJECT_ROOT

LAYERS = ("preprocessing", "pgt", "tune", "flows")  # bottom to top


def imported_packages(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_no_package_imports_one_above_it():
    wrong = []
    for level, package in enumerate(LAYERS):
        above = set(LAYERS[level + 1:])
        for path in sorted((PROJECT_ROOT / package).glob("*.py")):
            wrong += [f"{path.relative_to(PROJECT_ROOT)} imports {name}" for name in imported_packages(path) & above]
    assert wrong == []


def test_the_layering_test_sees_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from tune.sweep import run_sweep\n")
    assert "tune" in imported_packages(bad)


def test_pgt_tune_comes_from_the_tune_package_through_an_entry_point():
    from importlib.metadata import entry_points

    (command,) = entry_points(group="pgt.commands", name="tune")
    assert command.value == "tune.cli:tune"
    r = subprocess.run([sys.executable, "-m", "pgt.cli", "tune", "--help"], capture_output=True, text=True,
                       env={"COLUMNS": "200", "PATH": ""}, cwd=PROJECT_ROOT)
    assert r.returncode == 0 and "--objective" in r.stdout and "strict_acc@1" in r.stdout
