#!/usr/bin/env bash
# Serve a registered model over HTTP with `pgt serve` (MLflow's scoring protocol, a request size limit of
# ${SERVE_MAX_REQUEST_MB:-16} MB, one-line 400s, a warm model), bound to 127.0.0.1:${SERVE_PORT:-5056}.
# SERVE_MAX_IN_FLIGHT, SERVE_MAX_QUEUED, SERVE_MAX_BUFFERED_MB, SERVE_QUEUE_TIMEOUT_S and SERVE_BODY_TIMEOUT_S, where
# set, are pgt serve's admission settings (`pgt serve --help`).
#   scripts/start-serve.sh [MODEL_URI]    (default models:/${PGT_MODEL_NAME:-pgt-demo}@champion)
# The model loads from MLFLOW_TRACKING_URI (default: the local server of start-mlflow.sh) in this project's
# environment. Waits for /ping; prints the address. Idempotent.
set -euo pipefail
source "$(dirname "$0")/_lib.sh"
PORT="${SERVE_PORT:-5056}"
MODEL="${1:-models:/${PGT_MODEL_NAME:-pgt-demo}@champion}"
DIR="$STATE/serve"
mkdir -p "$DIR"
PIDFILE="$DIR/server.pid"
URL="http://127.0.0.1:$PORT"
export PATH="$VENV_BIN:$PATH"  # mlflow runs uvicorn from PATH
export MLFLOW_TRACKING_URI="${MLFLOW_TRACKING_URI:-http://127.0.0.1:${MLFLOW_PORT:-5055}}"
if running "$PIDFILE"; then  # one server per state folder: say where it is, whatever SERVE_PORT says now
    echo "serve: already running at $(cat "$DIR/url" 2>/dev/null || echo "$URL") (pid $(cat "$PIDFILE"), model $(cat "$DIR/model" 2>/dev/null)); scripts/stop-serve.sh stops it"
    exit 0
fi
# Nothing is unpickled: the model is models-from-code (pgt/serving/mlflow_model.py). A request is a few dozen rows:
# one polars thread per worker answers it faster than a pool (scale with SERVE_WORKERS instead).
POLARS_MAX_THREADS="${POLARS_MAX_THREADS:-1}" MLFLOW_ALLOW_PICKLE_DESERIALIZATION=false setsid "$VENV_BIN/pgt" serve --model "$MODEL" \
    --host 127.0.0.1 --port "$PORT" --workers "${SERVE_WORKERS:-1}" --max-request-mb "${SERVE_MAX_REQUEST_MB:-16}" \
    ${SERVE_MAX_IN_FLIGHT:+--max-in-flight "$SERVE_MAX_IN_FLIGHT"} ${SERVE_MAX_QUEUED:+--max-queued "$SERVE_MAX_QUEUED"} \
    ${SERVE_MAX_BUFFERED_MB:+--max-buffered-mb "$SERVE_MAX_BUFFERED_MB"} \
    ${SERVE_QUEUE_TIMEOUT_S:+--queue-timeout-s "$SERVE_QUEUE_TIMEOUT_S"} ${SERVE_BODY_TIMEOUT_S:+--body-timeout-s "$SERVE_BODY_TIMEOUT_S"} \
    >"$DIR/server.log" 2>&1 &
echo $! >"$PIDFILE"
echo "$MODEL" >"$DIR/model"
echo "$URL" >"$DIR/url"
if ! wait_healthy serve "$URL/ping" "${SERVE_START_TIMEOUT_S:-120}" "$(cat "$PIDFILE")"; then
    tail -5 "$DIR/server.log" >&2
    rm -f "$PIDFILE"
    exit 1
fi
echo "serve: $MODEL at $URL/invocations (pid $(cat "$PIDFILE"), log $DIR/server.log)"
