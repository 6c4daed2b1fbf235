#!/usr/bin/env bash
# Start a local S3-compatible object store (moto's server mode, the one Ray's and MLflow's own suites use) for trying
# storage URIs without a cloud account: in memory, bound to ${S3_HOST:-127.0.0.1}:${S3_PORT:-5056}. Waits until it
# answers; prints the address and the URI form the project reads. Idempotent. Its objects live as long as it does.
# Clients need credentials set (any value): AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
set -euo pipefail
source "$(dirname "$0")/_lib.sh"
HOST="${S3_HOST:-127.0.0.1}"
PORT="${S3_PORT:-5056}"
DIR="$STATE/s3"
mkdir -p "$DIR"
PIDFILE="$DIR/server.pid"
URL="http://$HOST:$PORT"
if running "$PIDFILE"; then
    echo "s3: already running at $URL (pid $(cat "$PIDFILE"))"
    exit 0
fi
setsid "$VENV_BIN/moto_server" -H "$HOST" -p "$PORT" >"$DIR/server.log" 2>&1 &
echo $! >"$PIDFILE"
if ! wait_healthy s3 "$URL/moto-api/" "${S3_START_TIMEOUT_S:-30}" "$(cat "$PIDFILE")"; then
    tail -5 "$DIR/server.log" >&2
    exit 1
fi
echo "s3: $URL (pid $(cat "$PIDFILE"), log $DIR/server.log); URIs: s3://BUCKET/FOLDER?endpoint_override=$HOST:$PORT&scheme=http, or AWS_ENDPOINT_URL=$URL"
