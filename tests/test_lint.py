"""The code stays as ruff's settings in pyproject.toml want it, and every `noqa` says why."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT

PACKAGES = ("pgt", "preprocessing", "tune", "flows", "tests", "benchmarks", "scripts")
REASONED = re.compile(r"# noqa: [A-Z]+[0-9]+(?:, ?[A-Z]+[0-9]+)* - \S")  # codes, then " - " and the reason


def test_every_noqa_names_its_rules_and_a_reason():
    bare = [f"{path.relative_to(PROJECT_ROOT)}:{i}" for package in PACKAGES
            for path in sorted((PROJECT_ROOT / package).rglob("*.py"))
            for i, line in enumerate(path.read_text().splitlines(), 1)
            if "# noqa" in line and not REASONED.search(line) and path.name != "test_lint.py"]
    assert bare == [], f"noqa without rules and a reason: {bare}"


def test_ruff_finds_nothing():
    ruff = Path(sys.executable).with_name("ruff")
    if not ruff.exists() and shutil.which("ruff") is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    r = subprocess.run([str(ruff) if ruff.exists() else "ruff", "check", "."], cwd=PROJECT_ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:]
