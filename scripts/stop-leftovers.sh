#!/usr/bin/env bash
# Stop what killed runs of this project left behind (see `leftovers` in _lib.sh): orphaned flow runs, Ray
# instances, servers without a PID file. Each goes with its whole process tree: SIGTERM, then SIGKILL after 15 s.
set -uo pipefail
source "$(dirname "$0")/_lib.sh"
found="$(leftovers | tr '\n' ' ')"
if [ -z "${found// /}" ]; then
    echo "leftovers: none"
    exit 0
fi
all="$found"
for pid in $found; do
    all="$all $(descendants "$pid" | tr '\n' ' ')"
done
for pid in $found; do
    echo "leftover: pid $pid: $(ps -ww -o args= -p "$pid" 2>/dev/null | cut -c1-120)"
done
# shellcheck disable=SC2086  # a list of PIDs
kill -TERM $all 2>/dev/null
for _ in $(seq 1 15); do
    # shellcheck disable=SC2086
    any_alive $all || break
    sleep 1
done
kill -KILL $all 2>/dev/null
echo "leftovers: stopped $(wc -w <<<"$found") (and $(( $(wc -w <<<"$all") - $(wc -w <<<"$found") )) processes they started)"
