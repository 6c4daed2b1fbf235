"""What MLflow holds of a training run and of a registered version, in a form two callers' runs can be compared by:
`pgt train`, a sweep's final run and the flow must leave the same record for the same settings."""

from __future__ import annotations

import json

RUN_SPECIFIC_PARAMS = frozenset({"out_dir", "resume"})  # where the run wrote, and whether a rerun continues it
# a version's tags that say what it was registered on (their values differ with the evidence, their presence not)
EVIDENCE_TAGS = frozenset({"pgt.evidence_seeds", "pgt.evidence_scores", "pgt.data_digest", "validation_strict_acc_at_1",
                           "champion_validation_strict_acc_at_1", "champion_decision", "champion_reason", "run_id"})


def _artifacts(client, run_id: str, path: str | None = None) -> list[str]:
    found = []
    for item in client.list_artifacts(run_id, path):
        found += _artifacts(client, run_id, item.path) if item.is_dir else [item.path]
    return found


def run_record(client, run_id: str) -> dict:
    """A run's params (but where it wrote), dataset inputs, metric names (not the sampled system ones), artifacts,
    and its logged model's flavors and signature."""
    import mlflow

    run = client.get_run(run_id)
    models = client.search_logged_models(experiment_ids=[run.info.experiment_id],
                                         filter_string=f"source_run_id = '{run_id}'")
    model = None
    if models:
        info = mlflow.models.get_model_info(models[0].model_uri)
        model = {"flavors": sorted(info.flavors), "signature": json.dumps(info.signature.to_dict(), sort_keys=True)}
    return {
        "params": {k: v for k, v in run.data.params.items() if k not in RUN_SPECIFIC_PARAMS},
        "datasets": sorted((d.dataset.name, d.dataset.digest, d.dataset.source_type,
                            tuple(sorted((t.key, t.value) for t in d.tags))) for d in run.inputs.dataset_inputs),
        "metrics": sorted(k for k in run.data.metrics if not k.startswith("system/")),
        "epochs": len(client.get_metric_history(run_id, "train_loss")),
        "artifacts": sorted(_artifacts(client, run_id)),
        "model": model,
        "status": run.info.status,
    }


def version_record(client, name: str, version: str) -> dict:
    """A registered version's tags by kind: which evidence tags it carries, the data it was measured on, its run's
    lineage tags present."""
    found = client.get_model_version(name, version)
    tags = found.tags
    return {"evidence": sorted(set(tags) & EVIDENCE_TAGS), "data_digest": tags.get("pgt.data_digest"),
            "lineage": sorted(k for k in ("recipe", "git_commit") if k in tags),
            "run_tags_of": found.run_id == tags.get("run_id")}
