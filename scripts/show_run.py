"""Print the state of the latest run of a deployment and one of its markdown artifacts (used by scripts/demo.sh).

    python scripts/show_run.py preprocess-and-train/demo                               (the metrics)
    python scripts/show_run.py predict-next-places/predict pgt-predictions-summary     (the prediction summary)
Exit code 1 when that run did not complete.
"""

from __future__ import annotations

import sys

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterKey,
    DeploymentFilter,
    DeploymentFilterId,
)
from prefect.client.schemas.sorting import FlowRunSort
from rich.console import Console
from rich.markdown import Markdown


def main(deployment_name: str, artifact_key: str = "pgt-metrics") -> int:
    console = Console()
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(deployment_name)
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])),
                                     sort=FlowRunSort.START_TIME_DESC, limit=1)
        if not runs:
            console.print(f"error: {deployment_name} has no runs")
            return 1
        run = runs[0]
        console.print(f"flow run {run.name} ({run.id}): {run.state.name}", soft_wrap=True)
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[artifact_key]), flow_run_id=ArtifactFilterFlowRunId(any_=[run.id])))
        for artifact in artifacts:
            console.print(Markdown(artifact.data))
        if not run.state.is_completed():
            console.print(f"error: the run ended {run.state.name}: {run.state.message}", soft_wrap=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]) if len(sys.argv) > 1 else main("preprocess-and-train/demo"))
