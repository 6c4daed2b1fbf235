#!/usr/bin/env bash
# Start a local MLflow tracking server: SQLite backend and artifact store under $PGT_STATE_DIR/mlflow,
# bound to ${MLFLOW_HOST:-127.0.0.1}:${MLFLOW_PORT:-5055}. Waits for /health; prints the address. Idempotent.
# For a team or a Ray cluster: MLFLOW_HOST (an address every node reaches), MLFLOW_BACKEND_STORE_URI (e.g.
# postgresql://USER@HOST/DB; default SQLite in the state folder) and MLFLOW_ARTIFACTS_DESTINATION (e.g.
# s3://BUCKET/mlflow; default the state folder), artifacts proxied through the server either way.
# MLFLOW_ALLOWED_HOSTS (host:port list, comma-separated): the Host headers its API accepts (MLflow's --allowed-hosts;
# default localhost and private addresses), for a server reached by a name: the others get HTTP 403.
# MLFLOW_AUTH=basic: MLflow's basic-auth app (users and permissions in $PGT_STATE_DIR/mlflow/basic_auth.db, default
# permission READ); its admin is ${MLFLOW_AUTH_ADMIN_USERNAME:-admin} with MLFLOW_AUTH_ADMIN_PASSWORD, which the first
# start needs. Clients then set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD.
set -euo pipefail
source "$(dirname "$0")/_lib.sh"
PORT="${MLFLOW_PORT:-5055}"
HOST="${MLFLOW_HOST:-127.0.0.1}"
DIR="$STATE/mlflow"
mkdir -p "$DIR/artifacts"
PIDFILE="$DIR/server.pid"
BACKEND="${MLFLOW_BACKEND_STORE_URI:-sqlite:///$DIR/mlflow.db}"
ARTIFACTS="${MLFLOW_ARTIFACTS_DESTINATION:-$DIR/artifacts}"
ALLOWED=()
if [ -n "${MLFLOW_ALLOWED_HOSTS:-}" ]; then
    ALLOWED=(--allowed-hosts "$MLFLOW_ALLOWED_HOSTS")
elif [ "$HOST" != "127.0.0.1" ]; then  # MLflow answers 403 to a Host header it does not know: its own address
    ALLOWED=(--allowed-hosts "$HOST:$PORT,$HOST,localhost:$PORT,127.0.0.1:$PORT")
fi
APP=()
case "${MLFLOW_AUTH:-}" in
    "") ;;
    basic)
        if [ -z "${MLFLOW_AUTH_ADMIN_PASSWORD:-}" ] && [ ! -f "$DIR/basic_auth.db" ]; then
            echo "error: MLFLOW_AUTH=basic needs MLFLOW_AUTH_ADMIN_PASSWORD for the first start (the admin's password)" >&2
            exit 2
        fi
        cat >"$DIR/basic_auth.ini" <<INI
[mlflow]
default_permission = READ
database_uri = sqlite:///$DIR/basic_auth.db
admin_username = ${MLFLOW_AUTH_ADMIN_USERNAME:-admin}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
# a credential hashed (PBKDF2) once a minute, not at every request: uncached, a training run logs 7x slower; with one
# worker a password change takes effect at once
auth_cache_ttl_seconds = 60
INI
        if [ ! -s "$DIR/secret_key" ]; then  # signs the UI's sessions: one per state folder, kept across restarts
            (umask 077 && "$VENV_BIN/python" -c 'import secrets; print(secrets.token_hex(32))' >"$DIR/secret_key")
        fi
        export MLFLOW_AUTH_CONFIG_PATH="$DIR/basic_auth.ini"
        MLFLOW_FLASK_SERVER_SECRET_KEY="$(cat "$DIR/secret_key")"
        export MLFLOW_FLASK_SERVER_SECRET_KEY
        APP=(--app-name basic-auth)
        ;;
    *)
        echo "error: MLFLOW_AUTH=${MLFLOW_AUTH}: expected basic (MLflow's basic-auth app) or nothing" >&2
        exit 2
        ;;
esac
URL="http://$HOST:$PORT"
if running "$PIDFILE"; then
    echo "mlflow: already running at $URL (pid $(cat "$PIDFILE"))"
    exit 0
fi
# Job execution off: otherwise startup takes ~35 s and job runners outlive the server (../shared/STACK.md).
MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false setsid "$VENV_BIN/mlflow" server \
    --backend-store-uri "$BACKEND" --artifacts-destination "$ARTIFACTS" \
    --host "$HOST" --port "$PORT" --workers 1 "${ALLOWED[@]}" "${APP[@]}" >"$DIR/server.log" 2>&1 &
echo $! >"$PIDFILE"
if ! wait_healthy mlflow "$URL/health" "${MLFLOW_START_TIMEOUT_S:-90}" "$(cat "$PIDFILE")"; then
    tail -5 "$DIR/server.log" >&2
    exit 1
fi
echo "mlflow: $URL (pid $(cat "$PIDFILE"), log $DIR/server.log); runs: $URL/#/experiments?workflowType=machine_learning"
