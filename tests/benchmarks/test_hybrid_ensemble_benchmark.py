"""benchmarks/hybrid_ensemble.py: which ensembles it scores, how it stacks the two kinds of networks, and its results
held to the ensemble_size results of the same networks."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.benchmarks.conftest import BENCHMARKS, load_benchmark

RESULTS = BENCHMARKS / "results"


def test_each_ensemble_takes_j_of_the_protocol_networks_and_the_rest_of_the_deployed_ones():
    hybrid = load_benchmark("hybrid_ensemble")
    assert hybrid.mixed_combinations(3, 2, 3, 2) == [(0, 1, 3), (0, 1, 4), (0, 2, 3), (0, 2, 4), (1, 2, 3), (1, 2, 4)]
    assert hybrid.mixed_combinations(3, 2, 2, 0) == [(3, 4)]
    assert hybrid.mixed_combinations(3, 2, 1, 1) == [(0,), (1,), (2,)]
    assert hybrid.mixed_combinations(3, 2, 4, 1) == []  # three deployed networks wanted, two there
    assert hybrid.mixed_combinations(3, 2, 2, 3) == []  # more from the protocol than members


def test_the_caches_are_stacked_batch_by_batch_and_other_samples_are_refused():
    hybrid = load_benchmark("hybrid_ensemble")
    first = [(np.array([2, 0]), "b0", torch.zeros(2, 2, 5)), (np.array([1]), "b1", torch.zeros(2, 1, 5))]
    second = [(np.array([2, 0]), "b0", torch.ones(3, 2, 5)), (np.array([1]), "b1", torch.ones(3, 1, 5))]
    stacked = hybrid.joined(first, second)
    assert [s[1] for s in stacked] == ["b0", "b1"] and stacked[0][2].shape == (5, 2, 5)
    assert stacked[1][2][:2].sum() == 0 and stacked[1][2][2:].sum() == 3 * 5
    with pytest.raises(RuntimeError, match="different samples"):
        hybrid.joined(first, [(np.array([0, 2]), "b0", torch.ones(3, 2, 5)), second[1]])
    with pytest.raises(RuntimeError, match="2 and 1 batches"):
        hybrid.joined(first, second[:1])


def test_the_members_anchor_is_the_recipes_unless_the_settings_say_otherwise():
    size = load_benchmark("ensemble_size")
    assert size.members_anchor("tuned", {}) == "target_day"
    assert size.members_anchor("tuned-deployed", {}) == "last_visit"
    assert size.members_anchor("tuned", {"anchor": "last_visit", "day_gaps": 1}) == "last_visit"


def test_the_results_agree_with_each_recipes_own_ensembles():
    """Ensembles of one kind are those ensemble_size scored; a network of the live inputs scores the same both ways."""
    rows = {(r["members"], r["protocol_members"]): r for r in json.loads((RESULTS / "hybrid_ensemble.json").read_text())["rows"]}
    # the networks of --work's default, trained for tuned-2026-12-05 (`tuned` when hybrid_ensemble.json was made)
    protocol = {r["members"]: r for r in json.loads((RESULTS / "ensemble_size-tuned-2026-12-05.json").read_text())["sizes"]}
    deployed = {r["members"]: r for r in json.loads((RESULTS / "ensemble_size-tuned-deployed.json").read_text())["sizes"]}
    for (k, j), row in rows.items():
        if j == k:
            assert row["strict_acc@1"] == protocol[k]["protocol_validation_strict_acc@1"]
            assert row["deployment_strict_acc@1"] == protocol[k]["deployment_validation_strict_acc@1"]
        if j == 0:
            assert row["strict_acc@1"] == row["deployment_strict_acc@1"] == deployed[k]["deployment_validation_strict_acc@1"]
    # as deployed, no mixture of six beats the best of either kind by more than a tenth: the live inputs' ceiling
    best = max(kind[6]["deployment_validation_strict_acc@1"]["mean"] for kind in (protocol, deployed))
    assert all(rows[(6, j)]["deployment_strict_acc@1"]["mean"] <= best + 0.1 for j in range(7))


def test_a_network_is_known_by_the_anchor_its_run_was_trained_with(tmp_path):
    hybrid = load_benchmark("hybrid_ensemble")
    (tmp_path / "metrics.json").write_text(json.dumps({"config": {"anchor": "last_visit", "seed": 0}}))
    assert hybrid.trained_anchor(tmp_path) == "last_visit"
