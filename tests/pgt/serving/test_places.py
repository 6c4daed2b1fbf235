"""The helpers of place predictions on hand-built frames: recent days, the summary, the map."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import polars as pl

from pgt.serving.predict import last_days, plot_predicted_places, prediction_summary

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


def test_last_days_keeps_each_users_own_recent_days():
    points = pl.DataFrame({"user_id": ["a", "a", "a", "b"],
                           "tracked_at": [T0, T0 + timedelta(days=10), T0 + timedelta(days=20), T0 + timedelta(days=5)]})
    kept = last_days(points, 7)
    assert kept.rows() == [("a", T0 + timedelta(days=20)), ("b", T0 + timedelta(days=5))]


def predictions() -> pl.DataFrame:
    """One latest sample (user a: place 7, then a new place) and two evaluation samples (one hit at rank 1)."""
    return pl.DataFrame({
        "sample": ["latest", "latest", "evaluation", "evaluation", "evaluation", "evaluation"],
        "sample_index": [0, 0, 0, 0, 1, 1],
        "source_user_id": ["a"] * 6,
        "rank": [1, 2, 1, 2, 1, 2],
        "place_id": [7, None, 7, 8, 8, None],
        "latitude": [39.9, None, 39.9, 39.95, 39.95, None],
        "longitude": [116.3, None, 116.3, 116.35, 116.35, None],
        "probability": [0.6, 0.2, 0.5, 0.3, 0.7, 0.1],
        "new_place_probability": [0.2, 0.2, 0.1, 0.1, 0.1, 0.1],
        "target_place": [None, None, 7, 7, 9, 9],
    })


def test_prediction_summary_counts_users_and_scores_evaluation_samples_strictly():
    summary = prediction_summary(predictions())
    assert summary == {"users": 1, "evaluation_samples": 2, "evaluation_strict_acc@1": 50.0,
                       "mean_new_place_probability": 0.2}


def test_the_map_is_a_png(tmp_path):
    out = plot_predicted_places(predictions(), tmp_path / "maps" / "map.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5_000
