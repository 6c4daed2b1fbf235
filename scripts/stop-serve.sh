#!/usr/bin/env bash
# Stop the model server that start-serve.sh started (by its PID file).
set -euo pipefail
source "$(dirname "$0")/_lib.sh"
stop_pid serve "$STATE/serve/server.pid"
rm -f "$STATE/serve/model" "$STATE/serve/url"
