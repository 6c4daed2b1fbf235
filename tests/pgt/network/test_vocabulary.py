"""The protocol's view of the extended vocabulary: a new place's odds restored, every slot merged into id 1."""

from __future__ import annotations

import math

import torch

from pgt.config import ModelConfig
from pgt.data.scoring import Scores
from pgt.network.vocabulary import restore_new_place_odds


def test_a_new_places_odds_are_raised_and_the_row_renormalised():
    log_probs = torch.log(torch.tensor([[0.0, 0.1, 0.6, 0.3]]) + 1e-12)  # V = 4: padding, a new place, two known ids
    restored = restore_new_place_odds(log_probs, math.log(9))  # the new place's 0.1 weighs 0.9 beside 0.6 and 0.3
    assert torch.allclose(restored.exp(), torch.tensor([[0.0, 0.5, 1 / 3, 1 / 6]]), atol=1e-6)
    assert restore_new_place_odds(log_probs, 0.0) is log_probs  # no weight to undo: the model's own


def test_the_protocols_view_restores_the_odds_before_merging_and_the_strict_scores_keep_the_models():
    probs = torch.tensor([[0.0, 0.05, 0.5, 0.3, 0.15]])  # V = 4 and one slot
    cfg = ModelConfig(num_locations=4, num_users=2, new_place_log_odds=math.log(4))
    scores = Scores.from_log_probs(torch.log(probs + 1e-12), cfg)
    assert torch.equal(scores.extended, torch.log(probs + 1e-12))  # strict ranks read the network's scores
    # the new place's 0.05 weighs 0.2 (total 1.15), then the slot's 0.15 joins id 1: (0.2 + 0.15) / 1.15
    assert torch.allclose(scores.protocol.exp(), torch.tensor([[0.0, 0.35, 0.5, 0.3]]) / 1.15, atol=1e-6)
    assert int(scores.protocol.argmax()) == 2  # the known id 2 still leads the protocol's ranking here
