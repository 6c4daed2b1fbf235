#!/usr/bin/env bash
# Start a local MLflow tracking server: SQLite backend and artifact store under $PGT_STATE_DIR/mlflow,
# bound to 127.0.0.1:${MLFLOW_PORT:-5055}. Waits for /health; prints the address. Idempotent.
# MLFLOW_ALLOWED_HOSTS (host:port list, comma-separated): the Host headers its API accepts (MLflow's --allowed-hosts;
# default localhost and private addresses), for a server reached by a name: the others get HTTP 403.
set -euo pipefail
source "$(dirname "$0")/_lib.sh"
PORT="${MLFLOW_PORT:-5055}"
DIR="$STATE/mlflow"
mkdir -p "$DIR/artifacts"
PIDFILE="$DIR/server.pid"
ALLOWED=()
if [ -n "${MLFLOW_ALLOWED_HOSTS:-}" ]; then
    ALLOWED=(--allowed-hosts "$MLFLOW_ALLOWED_HOSTS")
fi
URL="http://127.0.0.1:$PORT"
if running "$PIDFILE"; then
    echo "mlflow: already running at $URL (pid $(cat "$PIDFILE"))"
    exit 0
fi
# Job execution off: otherwise startup takes ~35 s and job runners outlive the server (../shared/STACK.md).
MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false setsid "$VENV_BIN/mlflow" server \
    --backend-store-uri "sqlite:///$DIR/mlflow.db" --artifacts-destination "$DIR/artifacts" \
    --host 127.0.0.1 --port "$PORT" --workers 1 "${ALLOWED[@]}" >"$DIR/server.log" 2>&1 &
echo $! >"$PIDFILE"
if ! wait_healthy mlflow "$URL/health" "${MLFLOW_START_TIMEOUT_S:-90}" "$(cat "$PIDFILE")"; then
    tail -5 "$DIR/server.log" >&2
    exit 1
fi
echo "mlflow: $URL (pid $(cat "$PIDFILE"), log $DIR/server.log); runs: $URL/#/experiments?workflowType=machine_learning"
