#!/usr/bin/env bash
# The GPU benchmarks on a machine without PyPI, from the project folder: unpack the parts of .gpu-deps/ that
# have come (scripts/pack_gpu_deps.py made them; each part may come in its own transfer), then run the stages
# asked for, each under its own time limit, each writing its JSON and log into RESULTS_DIR.
#
#   scripts/gpu_bench.sh DATA_DIR RESULTS_DIR [STAGE...]
#
# Stages (in the order given; default: check profile train sweep, the GPU's own tests first):
#   unpack    only unpack what has come
#   check     the GPU's own tests: tests/pgt/training/test_step.py (the captured step trains the uncaptured one's
#             weights) and tests/pgt/network/test_model.py (the one-hot lookup trains what the embedding lookup does)
#   profile   benchmarks/profile_gpu.py: one epoch of $RECIPE (tuned) under torch.profiler (needs polars, not Ray),
#             first with every table an embedding lookup (--one-hot-rows 0: the baseline, *_embedding.json), then
#             as training runs (small tables as one-hot products)
#   fused     benchmarks/fused_seeds.py: 1, 3 and 5 seeds of $RECIPE fused in one run, $FUSED_EPOCHS epochs each
#   train     benchmarks/train.py --gpu --engine ray-train, the recipes $MODELS (pgt:tuned), seeds $SEEDS
#   sweep     benchmarks/sweep_gpu.py: $TRIALS trials of at most $SWEEP_EPOCHS epochs, $CONCURRENT at once, then
#             $FINALISTS finalists on $CONFIRM_SEEDS fresh seeds and the winner's final run; REUSE_ACTORS=0 starts
#             a fresh process per trial (the baseline of reused ones: sweep_gpu*_fresh_processes.json)
# Every stage trains with --resident-data --static-width $STATIC_WIDTH (16); COMPILE=1 adds --compile-model
# (torch.compile; CUDA graphs of the pass unless the step is captured) and CAPTURE=1 adds --capture-step (the whole
# step as one CUDA graph per width): the profile, fused and sweep stages then write *_compiled.json,
# *_captured.json or *_compiled_captured.json, every stage its log likewise, and train adds a configuration of its
# own to train_gpu.json.
# A stage that fails or runs out of time is reported and the next one runs.
set -uo pipefail

if [ $# -lt 2 ]; then
    echo "usage: scripts/gpu_bench.sh DATA_DIR RESULTS_DIR [unpack|check|profile|fused|train|sweep]..." >&2
    exit 2
fi
data=$1 results=$2
shift 2
stages=${*:-check profile train sweep}
deps=${PGT_DEPS:-/tmp/pgt-deps}   # where the parts are unpacked (put on PYTHONPATH)
parts=${GPU_DEPS:-.gpu-deps}       # where scripts/pack_gpu_deps.py put them
mkdir -p "$deps" "$results"

for part in "$parts"/*.tar.xz; do
    [ -e "$part" ] || continue
    done_mark="$deps/.$(basename "$part").$(stat -c %s-%Y "$part").unpacked"  # a part packed again: again
    [ -e "$done_mark" ] && continue
    echo "unpacking $part into $deps"
    tar xJf "$part" -C "$deps" && touch "$done_mark" || { echo "error: $part: could not be unpacked" >&2; exit 1; }
done
export PYTHONPATH="$deps:$PWD" RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
device=${DEVICE:-cuda}  # cpu: a dry run of the same stages
shape=(--resident-data --static-width "${STATIC_WIDTH:-16}")
suffix=""
profile_limit=${PROFILE_LIMIT_S:-60}
if [ "${COMPILE:-0}" = 1 ]; then
    shape+=(--compile-model)
    suffix=_compiled
    profile_limit=${PROFILE_LIMIT_S:-300}  # its warm-up epoch compiles every width
fi
if [ "${CAPTURE:-0}" = 1 ]; then
    shape+=(--capture-step)
    suffix=${suffix}_captured
fi
failed=0

stage() {  # stage NAME LIMIT_S COMMAND...: run it under its limit, its output also in RESULTS_DIR/NAME.log
    local name=$1 limit=$2
    shift 2
    echo "== $name (at most ${limit} s): $*"
    timeout --signal=INT --kill-after=15 "$limit" "$@" 2>&1 | tee "$results/$name.log"
    local rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || { echo "== $name: exit $rc" >&2; failed=1; }
}

for s in $stages; do
    case $s in
        unpack) ;;
        check)
            stage "check${suffix//_/-}" "${CHECK_LIMIT_S:-180}" "$python" -m pytest -q -p no:cacheprovider \
                tests/pgt/training/test_step.py tests/pgt/network/test_model.py ;;
        fused)
            stage "fused${suffix//_/-}" "${FUSED_LIMIT_S:-240}" "$python" benchmarks/fused_seeds.py --data-dir "$data" \
                --recipe "${RECIPE:-tuned}" --counts 1 3 5 --epochs "${FUSED_EPOCHS:-12}" "${shape[@]}" \
                --device "$device" --results "$results/fused_seeds_gpu$suffix.json" ;;
        profile)
            stage "profile${suffix//_/-}-embedding" "$profile_limit" "$python" benchmarks/profile_gpu.py --data-dir "$data" \
                --recipe "${RECIPE:-tuned}" "${shape[@]}" --device "$device" --one-hot-rows 0 \
                --results "$results/profile_gpu${suffix}_embedding.json"
            stage "profile${suffix//_/-}" "$profile_limit" "$python" benchmarks/profile_gpu.py --data-dir "$data" \
                --recipe "${RECIPE:-tuned}" "${shape[@]}" --device "$device" --results "$results/profile_gpu$suffix.json" ;;
        train)
            [ -e "$results/train_gpu.json" ] || cp benchmarks/results/train_gpu.json "$results/" 2>/dev/null
            # shellcheck disable=SC2086  # SEEDS is a list
            models=${MODELS:-pgt:tuned}
            # each recipe's log of its own: train.log for tuned alone, else train-<recipes>.log
            name=train$( [ "$models" = pgt:tuned ] || echo "-${models//[^a-z0-9]/-}" )
            stage "$name${suffix//_/-}" "${TRAIN_LIMIT_S:-300}" "$python" benchmarks/train.py --gpu --variants published \
                --data-dir "$data" --models $models --seeds ${SEEDS:-0 1 2} --engine ray-train "${shape[@]}" \
                --device "$device" --results "$results/train_gpu.json" --work "${WORK_DIR:-/tmp/pgt-work}" ;;
        sweep)
            reuse=(--reuse-actors) fresh=""
            [ "${REUSE_ACTORS:-1}" = 0 ] && reuse=(--no-reuse-actors) fresh=_fresh_processes
            stage "sweep${suffix//_/-}${fresh//_/-}" "${SWEEP_LIMIT_S:-240}" "$python" benchmarks/sweep_gpu.py --data-dir "$data" \
                --trials "${TRIALS:-32}" --epochs "${SWEEP_EPOCHS:-10}" --concurrent "${CONCURRENT:-8}" \
                --budget-s "${SWEEP_BUDGET_S:-180}" --finalists "${FINALISTS:-3}" --confirm-seeds "${CONFIRM_SEEDS:-3}" \
                "${shape[@]}" "${reuse[@]}" \
                --device "$device" --results "$results/sweep_gpu$suffix$fresh.json" --work "${WORK_DIR:-/tmp/pgt-work}" ;;
        *) echo "error: unknown stage '$s' (expected unpack, check, profile, fused, train or sweep)" >&2; exit 2 ;;
    esac
done
exit $failed
