"""Committed benchmark results name their data and folders as a clone would: relative to the clone, or by the
data's own folder and file, never by the absolute paths of the machine that made them."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.preprocess import ROOT, shown_path

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
TOOLS = ("/usr/", "/bin/")  # where a machine's programs live (its C compiler): a fact of the machine, not a folder of ours


def absolute_paths(value, where: str = "") -> list[str]:
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in absolute_paths(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in absolute_paths(v, f"{where}[{i}]")]
    if isinstance(value, str) and value.startswith("/") and value.count("/") > 1 and not value.startswith(TOOLS):
        return [f"{where}: {value}"]
    return []


def test_committed_results_hold_no_absolute_path():
    found = {path.name: absolute_paths(json.loads(path.read_text())) for path in sorted(RESULTS.glob("*.json"))}
    assert found and not {name: paths for name, paths in found.items() if paths}


def test_shown_path_is_relative_inside_the_clone_and_short_outside(tmp_path):
    assert shown_path(ROOT / ".state" / "benchmarks" / "geolife") == ".state/benchmarks/geolife"
    assert shown_path(tmp_path / "data" / "points.parquet") == "data/points.parquet"
