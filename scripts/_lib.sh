# Shared helpers of the stack scripts: state folder, PID files, health checks, shutdown by PID.
# Everything binds to 127.0.0.1 (unless told another address) and lives under $PGT_STATE_DIR (default: <project>/.state).

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

# descendants PID: every process below PID in the process tree (children first found, then theirs), one per line.
descendants() {
    local table
    table="$(ps -eo pid=,ppid=)"
    local todo=("$1") pid child
    while [ "${#todo[@]}" -gt 0 ]; do
        pid="${todo[0]}"
        todo=("${todo[@]:1}")
        for child in $(awk -v p="$pid" '$2 == p {print $1}' <<<"$table"); do
            echo "$child"
            todo+=("$child")
        done
    done
}

# any_alive PID...: true when one of the processes still runs (a zombie waiting for its parent does not).
any_alive() {
    local pid
    for pid in "$@"; do
        case "$(ps -o stat= -p "$pid" 2>/dev/null)" in
            ""|Z*) ;;
            *) return 0 ;;
        esac
    done
    return 1
}

# stop_pid NAME PIDFILE: SIGTERM to the process, its process group and every descendant (found before any of
# them dies: a flow run the worker started, in its own group, and the Ray it started, go too), repeated for
# processes that ignore the first one, then SIGKILL after 30 s.
stop_pid() {
    local name=$1 pidfile=$2 pid waited=0 tree
    if ! running "$pidfile"; then
        rm -f "$pidfile"
        echo "$name: not running"
        return 0
    fi
    pid="$(cat "$pidfile")"
    tree="$(descendants "$pid" | tr '\n' ' ')"
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    # shellcheck disable=SC2086  # a list of PIDs
    kill -TERM $tree 2>/dev/null || true
    # shellcheck disable=SC2086
    while any_alive "$pid" $tree; do
        sleep 1
        waited=$((waited + 1))
        if [ $((waited % 5)) -eq 0 ]; then  # Prefect's worker ignores the first SIGTERM
            kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
        fi
        if [ "$waited" -ge 30 ]; then
            kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
            # shellcheck disable=SC2086
            kill -KILL $tree 2>/dev/null || true
            break
        fi
    done
    rm -f "$pidfile"
    echo "$name: stopped (pid $pid$([ -n "$tree" ] && echo ", and $(wc -w <<<"$tree") processes it started"), ${waited}s)"
}

# leftovers: PIDs of this project's orphans, processes left by a killed run (their parent gone: init, pid 1,
# adopted them) whose command runs from this project's environment (its python, Ray's binaries in its
# site-packages) and that were started for this state folder (state_of): a flow run, a Ray instance, a server
# whose PID file is lost. A command a person runs in a shell has that shell as its parent: never listed; nor is
# what another state folder's stack runs from the same environment. `ps -ww`: a command line is read whole,
# whatever the terminal's width or $COLUMNS (ps cuts it there otherwise).
leftovers() {
    local env_root state
    env_root="$(dirname "$VENV_BIN")"
    state="$(realpath -m -- "$STATE")"
    ps -ww -eo pid=,ppid=,args= | while read -r pid ppid args; do
        [ "$ppid" = 1 ] || continue
        case "$args" in
            *"$env_root"/*) [ "$(state_of "$pid")" = "$state" ] && echo "$pid" ;;
        esac
    done
}

# state_of PID: the state folder PID was started for: the PGT_STATE_DIR of its environment (a relative one from
# its working folder), or the default <project>/.state where it has none; nothing where its environment cannot
# be read (gone, or another user's).
state_of() {
    local environ dir
    environ="$(tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null)" || return 0
    [ -n "$environ" ] || return 0
    dir="$(sed -n 's/^PGT_STATE_DIR=//p' <<<"$environ" | tail -n 1)"
    [ -n "$dir" ] || dir="$PROJECT_ROOT/.state"
    (cd "/proc/$1/cwd" 2>/dev/null || cd /; realpath -m -- "$dir")
}
