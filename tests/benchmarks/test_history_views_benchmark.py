"""benchmarks/history_views.py's alignment of a shorter view's unseen-place slots with the whole history's."""

from __future__ import annotations

import math

import torch

from tests.benchmarks.conftest import load_benchmark


class Split:
    """The two columns slot_places reads: (N, T) slots and dataset-wide places."""

    def __init__(self, slots: list[list[int]], places: list[list[int]]):
        self.slots, self.places = torch.tensor(slots), torch.tensor(places)


def test_a_shorter_view_s_slots_move_to_the_whole_history_s_columns_for_the_same_place():
    views = load_benchmark("history_views")
    # the whole history visits unseen places 70 then 80 (slots 1, 2); the view keeps only the visit to 80, its slot 1
    whole = views.slot_places(Split([[1, 0, 2]], [[70, 5, 80]]))
    view = views.slot_places(Split([[0, 1, 0]], [[5, 80, 0]]))
    assert (whole, view) == ([{1: 70, 2: 80}], [{1: 80}])
    V = 3  # known places 0..2, then the slots' columns 3, 4
    log_probs = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.0]]))
    moved = views.aligned(log_probs, view, whole, V)
    assert torch.allclose(moved[0, :V], log_probs[0, :V])  # known places keep their columns
    assert math.isclose(moved[0, V + 1].exp().item(), 0.4, rel_tol=1e-6)  # place 80: the whole history's slot 2
    assert moved[0, V].item() == float("-inf")  # place 70, which the view does not see
