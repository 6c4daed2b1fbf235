# Environment of the local stack, sourced by the scripts (and usable by hand: `source scripts/env.sh`).
# Ports: PREFECT_PORT (4200), MLFLOW_PORT (5055). State: PGT_STATE_DIR (default <project>/.state).
source "$(dirname "${BASH_SOURCE[0]}")/_lib.sh"
export PGT_STATE_DIR="$STATE"
export PGT_PROJECT_DIR="$PROJECT_ROOT"
# where the `cluster` deployment clones the flow's code from at each run: a team's remote, or this checkout's
# committed branch by default
export PGT_REPOSITORY="${PGT_REPOSITORY:-file://$PROJECT_ROOT}"
export PGT_BRANCH="${PGT_BRANCH:-$(git -C "$PROJECT_ROOT" branch --show-current 2>/dev/null || true)}"
export PREFECT_PORT="${PREFECT_PORT:-4200}"
export MLFLOW_PORT="${MLFLOW_PORT:-5055}"
export PREFECT_HOME="$STATE/prefect"
export PREFECT_API_URL="http://127.0.0.1:$PREFECT_PORT/api"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_SERVER_API_HOST=127.0.0.1
export MLFLOW_TRACKING_URI="http://127.0.0.1:$MLFLOW_PORT"
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
export PGT_WORK_POOL="${PGT_WORK_POOL:-pgt-process}"
export PATH="$VENV_BIN:$PATH"
