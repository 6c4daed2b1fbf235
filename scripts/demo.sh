#!/usr/bin/env bash
# `make demo`: start the local stack (MLflow, Prefect server and worker), deploy prefect.yaml, run the demo
# deployment on the synthetic default, wait for it, print its metrics; then let the champion predict the
# demo people's next places (predict-next-places/predict) and print its summary and the UI addresses.
# Leaves the stack running; `make stop` (scripts/stop-stack.sh) stops it.
set -euo pipefail
DIR="$(dirname "$0")"
source "$DIR/env.sh"
began=$(date +%s)
# interrupted (Ctrl+C, a kill), the demo stops what it started, flow runs and their Ray included; a finished
# demo leaves the stack running for the UIs
trap 'echo "demo interrupted: stopping the stack" >&2; "$DIR/stop-stack.sh"; exit 130' INT TERM
"$DIR/start-stack.sh"
echo "running preprocess-and-train/demo (watch it at http://127.0.0.1:$PREFECT_PORT/runs) ..."
prefect deployment run preprocess-and-train/demo --watch --watch-timeout "${DEMO_TIMEOUT_S:-1200}" \
    >"$PREFECT_HOME/demo-run.log" 2>&1 || true
python "$DIR/show_run.py" preprocess-and-train/demo || { tail -30 "$PREFECT_HOME/demo-run.log" >&2; exit 1; }
echo "running predict-next-places/predict: the champion scores the demo people's last 14 days ..."
prefect deployment run predict-next-places/predict --watch --watch-timeout "${DEMO_TIMEOUT_S:-1200}" \
    >"$PREFECT_HOME/predict-run.log" 2>&1 || true
python "$DIR/show_run.py" predict-next-places/predict pgt-predictions-summary \
    || { tail -30 "$PREFECT_HOME/predict-run.log" >&2; exit 1; }
echo
echo "Prefect UI: http://127.0.0.1:$PREFECT_PORT    MLflow UI: http://127.0.0.1:$MLFLOW_PORT/#/experiments?workflowType=machine_learning"
trap - INT TERM
echo "demo finished in $(( $(date +%s) - began ))s; the stack keeps running: \`make stop\` stops it"
