# Shared helpers of the stack scripts: state folder, PID files, health checks, shutdown by PID.
# Everything binds to 127.0.0.1 and lives under $PGT_STATE_DIR (default: <project>/.state).

PROJECT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="${PGT_STATE_DIR:-$PROJECT_ROOT/.state}"
mkdir -p "$STATE"
STATE="$(cd "$STATE" && pwd)"
VENV_BIN="${PGT_VENV_BIN:-$PROJECT_ROOT/.venv/bin}"
[ -x "$VENV_BIN/python" ] || VENV_BIN="$(dirname "$(command -v python3)")"

# wait_healthy NAME URL TIMEOUT_S PID: poll URL until it answers 200, the process dies, or time runs out.
wait_healthy() {
    local name=$1 url=$2 timeout=$3 pid=$4 waited=0
    until curl -fsS -o /dev/null --max-time 2 "$url" 2>/dev/null; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "error: $name (pid $pid) exited before $url answered; see its log" >&2
            return 1
        fi
        if [ "$waited" -ge "$timeout" ]; then
            echo "error: $name did not answer $url within ${timeout}s; see its log" >&2
            return 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
}

# running PIDFILE: true when the PID in PIDFILE is alive.
running() {
    [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

# stop_pid NAME PIDFILE [SIGNALS]: SIGTERM (repeated for processes that ignore the first one), then SIGKILL
# after 30 s; the process group goes with it, so children (workers, job runners) do not outlive it.
stop_pid() {
    local name=$1 pidfile=$2 pid waited=0
    if ! running "$pidfile"; then
        rm -f "$pidfile"
        echo "$name: not running"
        return 0
    fi
    pid="$(cat "$pidfile")"
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
    while kill -0 "$pid" 2>/dev/null; do
        sleep 1
        waited=$((waited + 1))
        if [ $((waited % 5)) -eq 0 ]; then  # Prefect's worker ignores the first SIGTERM
            kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
        fi
        if [ "$waited" -ge 30 ]; then
            kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
            break
        fi
    done
    rm -f "$pidfile"
    echo "$name: stopped (pid $pid, ${waited}s)"
}
