#!/usr/bin/env bash
# Stop everything start-stack.sh and start-serve.sh started, then what killed runs of this project left behind.
set -uo pipefail
DIR="$(dirname "$0")"
"$DIR/stop-serve.sh"
"$DIR/stop-prefect.sh"
"$DIR/stop-mlflow.sh"
"$DIR/stop-leftovers.sh"
