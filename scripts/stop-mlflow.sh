#!/usr/bin/env bash
# Stop the MLflow server that start-mlflow.sh started (by its PID file).
set -euo pipefail
source "$(dirname "$0")/_lib.sh"
stop_pid mlflow "$STATE/mlflow/server.pid"
