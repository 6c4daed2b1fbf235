#!/usr/bin/env bash
# Stop the object store that start-s3.sh started (by its PID file); its objects go with it.
set -euo pipefail
source "$(dirname "$0")/_lib.sh"
stop_pid s3 "$STATE/s3/server.pid"
