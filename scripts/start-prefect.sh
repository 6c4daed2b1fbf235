#!/usr/bin/env bash
# Start a local Prefect server (SQLite under $PGT_STATE_DIR/prefect, 127.0.0.1:$PREFECT_PORT), create the
# process work pool and start a worker on it. Waits for /api/health. Idempotent.
set -euo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$PREFECT_HOME"
SERVER_PID="$PREFECT_HOME/server.pid"
WORKER_PID="$PREFECT_HOME/worker.pid"
if running "$SERVER_PID"; then
    echo "prefect server: already running at http://127.0.0.1:$PREFECT_PORT (pid $(cat "$SERVER_PID"))"
else
    setsid prefect server start --host 127.0.0.1 --port "$PREFECT_PORT" >"$PREFECT_HOME/server.log" 2>&1 &
    echo $! >"$SERVER_PID"
    if ! wait_healthy "prefect server" "$PREFECT_API_URL/health" "${PREFECT_START_TIMEOUT_S:-120}" "$(cat "$SERVER_PID")"; then
        tail -5 "$PREFECT_HOME/server.log" >&2
        exit 1
    fi
    echo "prefect server: http://127.0.0.1:$PREFECT_PORT (pid $(cat "$SERVER_PID"), log $PREFECT_HOME/server.log)"
fi
if ! prefect work-pool inspect "$PGT_WORK_POOL" >/dev/null 2>&1; then
    prefect work-pool create "$PGT_WORK_POOL" --type process >/dev/null
fi
# every deployment's runs share the state folder (sequences, stage cache, runs): one flow run at a time in the pool,
# the others queued, as each command refuses a second writer of its output
prefect work-pool set-concurrency-limit "$PGT_WORK_POOL" 1 >/dev/null
if running "$WORKER_PID"; then
    echo "prefect worker: already running (pid $(cat "$WORKER_PID"))"
else
    # the worker's environment (state folder, MLflow server, Ray auth) is what its flow runs see
    setsid prefect worker start --pool "$PGT_WORK_POOL" --type process >"$PREFECT_HOME/worker.log" 2>&1 &
    echo $! >"$WORKER_PID"
    for _ in $(seq 1 60); do
        grep -q "started" "$PREFECT_HOME/worker.log" 2>/dev/null && break
        kill -0 "$(cat "$WORKER_PID")" 2>/dev/null || { echo "error: prefect worker exited; see $PREFECT_HOME/worker.log" >&2; tail -5 "$PREFECT_HOME/worker.log" >&2; exit 1; }
        sleep 1
    done
    echo "prefect worker: pool $PGT_WORK_POOL (pid $(cat "$WORKER_PID"), log $PREFECT_HOME/worker.log)"
fi
