"""benchmarks/ensemble_temperature.py's tempered mean of an ensemble's members."""

from __future__ import annotations

import torch

from tests.benchmarks.conftest import load_benchmark


def test_t_1_is_the_plain_mean_and_a_higher_t_weighs_a_confident_member_less():
    tempered_mean = load_benchmark("ensemble_temperature").tempered_mean
    # member 0 sure of column 0, member 1 mildly for column 1
    members = torch.log(torch.tensor([[[0.98, 0.01, 0.01]], [[0.30, 0.40, 0.30]]]))  # (K=2, B=1, C=3)
    plain = tempered_mean(1.0)(members).exp()
    assert torch.allclose(plain, torch.tensor([[0.64, 0.205, 0.155]]), atol=1e-5)
    flat = tempered_mean(4.0)(members).exp()
    assert torch.allclose(flat.sum(-1), torch.ones(1)) and flat[0, 0] < plain[0, 0]
    # one member alone: its ranking whatever T
    assert tempered_mean(4.0)(members[:1]).argsort(-1).tolist() == members[0].argsort(-1).tolist()
