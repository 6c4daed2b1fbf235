"""The promotion rule alone (pgt.tracking.registry.promotion_decision), on evidence whose expected decision is stated."""

from __future__ import annotations

import json

import pytest

from pgt.tracking.registry import SEED_NOISE_FLOOR, Evidence, Z, data_digest, old_rule, promotion_decision, seed_spread


def test_the_first_version_is_promoted():
    assert promotion_decision(Evidence([0], [40.0], "d"), None)[:2] == (True, "promoted")


@pytest.mark.parametrize("challenger, expected", [
    ([48.0], False),  # a tie never promotes
    ([49.1], False),  # one seed against one: the margin is 1.645 x 0.5 x sqrt(2) = 1.16 points
    ([49.2], True),
])
def test_one_seed_against_one_needs_more_than_the_noise_floor_margin(challenger, expected):
    promoted, decision, reason = promotion_decision(Evidence([1], challenger, "d"), Evidence([0], [48.0], "d"))
    assert promoted is expected and decision == ("promoted" if expected else "kept")
    assert "margin of 1.16" in reason


def test_more_seeds_narrow_the_margin_and_a_wide_spread_widens_it():
    """Three seeds each: margin 1.645 x 0.5 x sqrt(2/3) = 0.67 with tight seeds; seeds spread by 2 points make the
    pooled spread, not the floor, the noise."""
    champion = Evidence([0, 1, 2], [48.0, 48.1, 47.9], "d")
    assert promotion_decision(Evidence([3, 4, 5], [48.8, 48.7, 48.6], "d"), champion)[0]  # +0.70 > 0.67
    assert not promotion_decision(Evidence([3, 4, 5], [48.6, 48.7, 48.5], "d"), champion)[0]  # +0.60
    spread = Evidence([3, 4, 5], [46.7, 48.7, 50.7], "d")  # mean 48.7, sd 2.0
    assert seed_spread(spread, champion) == pytest.approx(((2 * 4.0 + 2 * 0.01) / 4) ** 0.5)
    assert not promotion_decision(spread, champion)[0]
    assert seed_spread(Evidence([0], [1.0]), Evidence([1], [2.0])) == SEED_NOISE_FLOOR and Z == 1.645


def test_evidence_of_other_data_is_not_compared_and_unknown_data_is():
    promoted, decision, reason = promotion_decision(Evidence([1], [90.0], "aaaa"), Evidence([0], [40.0], "bbbb"))
    assert (promoted, decision) == (False, "not compared") and "other data" in reason
    assert promotion_decision(Evidence([1], [90.0], "aaaa"), Evidence([], [40.0], None))[0]  # a legacy champion


def test_tags_round_trip_and_a_version_from_before_evidence_counts_as_one_score():
    evidence = Evidence([3, 4], [47.5, 48.25], "abc")
    tags = evidence.tags()
    assert json.loads(tags["pgt.evidence_seeds"]) == [3, 4] and tags["pgt.data_digest"] == "abc"
    assert Evidence.from_tags(tags) == evidence
    assert Evidence.from_tags({"validation_strict_acc_at_1": "47.0"}) == Evidence([], [47.0], None)
    assert Evidence.from_tags({}) is None
    with pytest.raises(ValueError, match="2 seeds has 1 scores"):
        Evidence([1, 2], [40.0])
    with pytest.raises(ValueError, match="at least one"):
        Evidence([], [])


def test_the_data_digest_follows_the_input_and_the_preprocessing_config(tmp_path):
    def manifest(folder, sha, config):
        folder.mkdir()
        (folder / "manifest.json").write_text(json.dumps({"input_sha256": sha, "config": config, "counts": {}}))
        return folder

    a = data_digest(manifest(tmp_path / "a", "s1", {"eps_m": 20}))
    assert a == data_digest(manifest(tmp_path / "b", "s1", {"eps_m": 20})) and len(a) == 16
    assert a != data_digest(manifest(tmp_path / "c", "s1", {"eps_m": 50}))
    assert a != data_digest(manifest(tmp_path / "d", "s2", {"eps_m": 20}))


def test_the_old_rule_promotes_any_higher_score():
    assert old_rule(48.01, 48.0) and not old_rule(48.0, 48.0) and old_rule(10.0, None)
