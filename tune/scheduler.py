"""The trial scheduler of the sweeps."""

from __future__ import annotations

from ray.tune.schedulers import ASHAScheduler, TrialScheduler


class FinishingASHA(ASHAScheduler):
    """ASHA whose rungs lie before the last epoch, and which lets a trial that reaches it finish: plain ASHA
    stops a trial at max_t at once, cutting off its end (test metrics, metrics.json)."""

    def on_trial_result(self, tune_controller, trial, result):
        action = super().on_trial_result(tune_controller, trial, result)
        if action == TrialScheduler.STOP and result.get(self._time_attr, 0) >= self._max_t:
            return TrialScheduler.CONTINUE
        return action
