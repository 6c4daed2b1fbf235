"""The sweeps' scheduler (tune.scheduler.FinishingASHA) on hand-fed results, where ASHA must stop a trial: Ray's
own ASHA decides, and FinishingASHA lets a trial that reached the last epoch finish."""

from __future__ import annotations

import pytest
from ray.tune.experiment import Trial
from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from tune.scheduler import FinishingASHA

ARGS = dict(time_attr="training_iteration", metric="validation_strict_acc@1", mode="max", max_t=4, grace_period=1,
            reduction_factor=2)


def trials(scheduler, n: int) -> list[Trial]:
    made = [Trial("__fake", stub=True) for _ in range(n)]
    for trial in made:
        scheduler.on_trial_add(None, trial)
    return made


def report(scheduler, trial: Trial, epoch: int, score: float) -> str:
    return scheduler.on_trial_result(None, trial, {"training_iteration": epoch, "validation_strict_acc@1": score})


def test_a_trial_below_the_rung_s_median_is_stopped_at_the_grace_period():
    """Rungs at epochs 1 and 2 (grace period 1, reduction factor 2, max_t 4). The second trial to reach epoch 1
    with a worse score than the first is stopped there; a better one goes on."""
    scheduler = FinishingASHA(**ARGS)
    first, worse, better = trials(scheduler, 3)
    assert report(scheduler, first, 1, 40.0) == TrialScheduler.CONTINUE  # nothing to compare with yet
    assert report(scheduler, worse, 1, 10.0) == TrialScheduler.STOP
    assert report(scheduler, better, 1, 45.0) == TrialScheduler.CONTINUE
    assert report(scheduler, first, 2, 41.0) == TrialScheduler.CONTINUE
    assert report(scheduler, better, 2, 30.0) == TrialScheduler.STOP  # at the second rung, below the first's 41


@pytest.mark.parametrize("scheduler, action", [(ASHAScheduler(**ARGS), TrialScheduler.STOP),
                                               (FinishingASHA(**ARGS), TrialScheduler.CONTINUE)],
                         ids=["plain-asha-cuts-the-end", "finishing-asha-lets-it-finish"])
def test_a_trial_at_the_last_epoch_is_let_finish(scheduler, action):
    """Plain ASHA stops a trial the moment it reports max_t, before its end (test metrics, metrics.json) runs;
    FinishingASHA lets it finish. Below max_t it stops trials exactly as plain ASHA does."""
    (trial,) = trials(scheduler, 1)
    for epoch in (1, 2, 3):
        assert report(scheduler, trial, epoch, 40.0) == TrialScheduler.CONTINUE
    assert report(scheduler, trial, 4, 40.0) == action
