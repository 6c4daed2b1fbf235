"""The Model Registry's one door: every model `pgt train --register`, a sweep and the flow register goes through
`register_model`, and the alias `champion` moves only when the challenger's evidence beats the champion's by more
than seeds move a score.

    evidence = Evidence.of_run(result, data_dir)          # a run's: its seed, its validation strict Acc@1
    registered = register_model(uri, "pgt-geolife", model_uri, run_id, evidence)
    promotion_decision(challenger, champion)              # the rule alone (no MLflow)

The rule (`promotion_decision`). Evidence is validation strict Acc@1 on one or more seeds, with the digest of the
data it was measured on. The champion moves when
  1. there is none; or
  2. both were measured on the same data (the same digest), and the challenger's mean beats the champion's by more
     than a one-sided 95% margin: mean gain > Z * sigma * sqrt(1/n + 1/m), with n and m the seeds of each and
     sigma the seeds' spread: their pooled standard deviation, but never less than SEED_NOISE_FLOOR.
Evidence of other data is not compared: the champion stays, and the decision says why. A tie never promotes.

Why this margin: seeds move strict validation Acc@1 of one configuration by 0.3 to 0.9 points (tuned over ten seeds:
48.07 ± 0.39, benchmarks/results/promotion.json; test strict: ± 0.47 to 0.94), so a challenger of one seed beating a
champion of one seed by less than about a point says nothing about which configuration is better. The floor keeps
one or two seeds, whose sample spread is no estimate, from looking certain; with more seeds the margin shrinks as
1/sqrt(seeds), so evidence buys promotion. With tuned's spread, a same-recipe challenger of one seed clears the
one-seed margin (1.16) about 2 times in 100; registered on ten seeds one after another, a rule promoting any higher
score moved the champion once and this rule never (benchmarks/promotion.py).

Every registered version carries its evidence and the decision as tags (the MLflow UI's model version page shows
them): pgt.evidence_seeds and pgt.evidence_scores (JSON lists), pgt.data_digest, champion_decision ("promoted",
"kept", or "not compared") and champion_reason (one sentence), beside validation_strict_acc_at_1 (the evidence's
mean) and champion_validation_strict_acc_at_1 (the champion's, when there was one).
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from pgt.tracking.runs import CHAMPION, RIVAL_TAG, SCORE_TAG, VERSION_TAGS
from pgt.tracking.store import mlflow_client, use_tracking_uri

Z = 1.645  # one-sided 95%
SEED_NOISE_FLOOR = 0.5  # points of strict validation Acc@1: the least seed-to-seed spread the rule assumes
SEEDS_TAG, SCORES_TAG, DIGEST_TAG = "pgt.evidence_seeds", "pgt.evidence_scores", "pgt.data_digest"
DECISION_TAG, REASON_TAG = "champion_decision", "champion_reason"


@dataclass(frozen=True)
class Evidence:
    """What a model is registered on: validation strict Acc@1 per seed, and the data it was measured on."""

    seeds: list[int] = field(default_factory=list)  # the seeds the scores come from ([] where unknown)
    scores: list[float] = field(default_factory=list)  # strict validation Acc@1 per seed, in %
    data_digest: str | None = None  # data_digest(manifest) of the validation split's data; None where unknown

    def __post_init__(self) -> None:
        if not self.scores:
            raise ValueError("evidence needs at least one validation score")
        if self.seeds and len(self.seeds) != len(self.scores):
            raise ValueError(f"evidence of {len(self.seeds)} seeds has {len(self.scores)} scores")

    @property
    def mean(self) -> float:
        return sum(self.scores) / len(self.scores)

    @classmethod
    def of_run(cls, result: dict, data_dir: Path | str) -> Evidence:
        """A training run's (metrics.json's) evidence: its seed and held-out validation strict Acc@1 (a refit's is
        its selection run's), on the run's data."""
        return cls([int(result["config"]["seed"])], [float(result["validation"]["strict"]["acc@1"])],
                   data_digest(data_dir))

    def tags(self) -> dict[str, str]:
        return {SEEDS_TAG: json.dumps(self.seeds), SCORES_TAG: json.dumps([round(s, 4) for s in self.scores]),
                DIGEST_TAG: self.data_digest or "unknown", SCORE_TAG: repr(float(self.mean))}

    @classmethod
    def from_tags(cls, tags: dict[str, str]) -> Evidence | None:
        """A registered version's evidence; a version registered before evidence tags counts as one score of unknown
        seed and data; None without any score."""
        if SCORES_TAG in tags:
            digest = tags.get(DIGEST_TAG)
            return cls(json.loads(tags.get(SEEDS_TAG, "[]")), json.loads(tags[SCORES_TAG]),
                       None if digest in (None, "unknown") else digest)
        if SCORE_TAG in tags:
            return cls([], [float(tags[SCORE_TAG])], None)
        return None


def data_digest(data_dir: Path | str) -> str:
    """The data a score was measured on: the manifest's input digest and preprocessing config, hashed (16 hex
    digits). The same input preprocessed otherwise is other data."""
    manifest = json.loads((Path(data_dir) / "manifest.json").read_text())
    key = json.dumps({"input_sha256": manifest.get("input_sha256"), "config": manifest.get("config")}, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def seed_spread(*evidence: Evidence) -> float:
    """The seeds' standard deviation, pooled over the evidence with two or more seeds, at least SEED_NOISE_FLOOR."""
    pooled = [(len(e.scores) - 1, statistics.variance(e.scores)) for e in evidence if len(e.scores) > 1]
    dof = sum(d for d, _ in pooled)
    sample = math.sqrt(sum(d * v for d, v in pooled) / dof) if dof else 0.0
    return max(sample, SEED_NOISE_FLOOR)


def promotion_decision(challenger: Evidence, champion: Evidence | None) -> tuple[bool, str, str]:
    """(promoted, decision, reason): the rule of the module's docstring."""
    if champion is None:
        return True, "promoted", f"No champion yet: the first version, {_describe(challenger)}."
    if challenger.data_digest and champion.data_digest and challenger.data_digest != champion.data_digest:
        return False, "not compared", (f"Measured on other data (digest {challenger.data_digest} against the "
                                       f"champion's {champion.data_digest}), so the scores are not comparable.")
    sigma = seed_spread(challenger, champion)
    margin = Z * sigma * math.sqrt(1 / len(challenger.scores) + 1 / len(champion.scores))
    gain = challenger.mean - champion.mean
    why = (f"{_describe(challenger)} against the champion's {_describe(champion)}: a gain of {gain:+.2f} against a "
           f"margin of {margin:.2f} ({Z} x seed spread {sigma:.2f} x sqrt(1/{len(challenger.scores)} + "
           f"1/{len(champion.scores)}))")
    if gain > margin:
        return True, "promoted", why + "."
    return False, "kept", why + ", within seed noise."


def old_rule(challenger: float, champion: float | None) -> bool:
    """The rule before evidence (kept for benchmarks/promotion.py's comparison): promote on any higher score."""
    return champion is None or challenger > champion


def _describe(evidence: Evidence) -> str:
    n = len(evidence.scores)
    return f"mean validation strict Acc@1 {evidence.mean:.2f} over {n} seed{'s' if n > 1 else ''}"


def register_model(tracking_uri: str, name: str, model_uri: str, run_id: str, evidence: Evidence) -> dict:
    """Register a version with its evidence; the alias `champion` moves to it by promotion_decision against the
    current champion's evidence. The decision, its reason and both evidences stay on the version as tags."""
    import mlflow
    from mlflow.exceptions import MlflowException

    use_tracking_uri(tracking_uri)
    client = mlflow_client(tracking_uri)
    run_tags = client.get_run(run_id).data.tags
    lineage = {tag: run_tags[key] for key, tag in VERSION_TAGS.items() if key in run_tags}
    try:
        champion = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        champion = None
    rival = Evidence.from_tags(champion.tags) if champion is not None else None
    promoted, decision, reason = promotion_decision(evidence, rival)
    version = mlflow.register_model(model_uri, name, tags={**evidence.tags(), "run_id": run_id, **lineage,
                                                           RIVAL_TAG: "none" if rival is None else repr(rival.mean),
                                                           DECISION_TAG: decision, REASON_TAG: reason})
    if promoted:
        client.set_registered_model_alias(name, CHAMPION, version.version)
    return {"name": name, "version": int(version.version), "promoted": promoted, "decision": decision,
            "reason": reason, "champion_version": int(version.version) if promoted else int(champion.version),
            "validation_strict_acc@1": evidence.mean, "evidence_seeds": evidence.seeds,
            "evidence_scores": evidence.scores,
            "champion_validation_strict_acc@1": rival.mean if rival is not None else None}


def champion_verdict(registered: dict) -> str:
    """What register_model decided, in words: "now champion", or why the champion stays."""
    if registered["promoted"]:
        return "now champion"
    return f"champion stays version {registered['champion_version']} ({registered['decision']})"
