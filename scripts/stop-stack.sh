#!/usr/bin/env bash
# Stop everything start-stack.sh started.
set -uo pipefail
DIR="$(dirname "$0")"
"$DIR/stop-prefect.sh"
"$DIR/stop-mlflow.sh"
