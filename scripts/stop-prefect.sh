#!/usr/bin/env bash
# Stop the Prefect worker and server that start-prefect.sh started (by their PID files).
set -euo pipefail
source "$(dirname "$0")/env.sh"
stop_pid "prefect worker" "$PREFECT_HOME/worker.pid"
stop_pid "prefect server" "$PREFECT_HOME/server.pid"
