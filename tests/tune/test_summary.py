"""What tune.json keeps of a trial's test metrics (no Ray needed)."""

from __future__ import annotations

from pgt.config import selection_score
from tune.config import SweepConfig
from tune.sweep import headline_metrics


def test_headline_keeps_protocol_and_strict_overall_metrics():
    metrics = {"acc@1": 50.0, "n": 10, "in_history": {"acc@1": 70.0},
               "strict": {"acc@1": 40.0, "n": 10, "in_history": {"acc@1": 60.0}},
               "new_place": {"rate": 15.0, "predicted": 5.0, "precision": 50.0, "recall": 20.0}}
    assert headline_metrics(metrics) == {"acc@1": 50.0, "n": 10, "strict": {"acc@1": 40.0, "n": 10},
                                  "new_place": {"rate": 15.0, "predicted": 5.0, "precision": 50.0, "recall": 20.0}}


def test_the_objective_picks_the_strict_or_the_protocol_score():
    validation = {"acc@1": 50.0, "strict": {"acc@1": 40.0}}
    assert selection_score(validation, SweepConfig(data_dir=".", out_dir=".").objective) == 40.0
    assert selection_score(validation, SweepConfig(data_dir=".", out_dir=".", objective="acc@1").objective) == 50.0
    assert SweepConfig(data_dir=".", out_dir=".").metric == "validation_strict_acc@1"


def test_an_unknown_objective_is_refused():
    import pytest

    with pytest.raises(ValueError, match="objective must be one of strict_acc@1, acc@1"):
        SweepConfig(data_dir=".", out_dir=".", objective="f1")
