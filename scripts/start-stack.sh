#!/usr/bin/env bash
# The whole local stack: MLflow server, Prefect server and worker, and the deployments of prefect.yaml.
set -euo pipefail
DIR="$(dirname "$0")"
source "$DIR/env.sh"
"$DIR/start-mlflow.sh"
"$DIR/start-prefect.sh"
cd "$PROJECT_ROOT"
prefect --no-prompt deploy --all >"$PREFECT_HOME/deploy.log" 2>&1 || { tail -20 "$PREFECT_HOME/deploy.log" >&2; exit 1; }
echo "deployments: $(prefect deployment ls 2>/dev/null | grep -oE '(preprocess-and-train|predict-next-places)/[a-z]+' | sort -u | tr '\n' ' ')"
echo "Prefect UI: http://127.0.0.1:$PREFECT_PORT   MLflow UI: http://127.0.0.1:$MLFLOW_PORT"
