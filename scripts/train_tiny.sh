#!/usr/bin/env bash
# Train the `tiny` preset from scratch on the synthetic evidence task: Stage 0 (tiny-only
# pretraining, vr_runtime/training/pretrain.py) -> Stages 1, 2, 3, 3b. About 20 minutes on 2 CPU
# cores (see the wall times in training_metrics.json).
#
#   scripts/train_tiny.sh [WORK_DIR]            (default runs/tiny)
#       everything goes under WORK_DIR: data, checkpoints, logs, the final weights
#       (WORK_DIR/stage3b/{model,routers}.safetensors) and the curves and metrics
#       (WORK_DIR/results/training_curves.png, training_metrics.json). Nothing in the checkout
#       changes.
#   scripts/train_tiny.sh --install [WORK_DIR]
#       the same, then replace the shipped weights (vr_runtime/assets/tiny/{model,routers}
#       .safetensors) and the committed results (bench/results/training_curves.png,
#       training_metrics.json), and measure the held-out routing metrics of the new shipped
#       weights (bench/results/routing_heldout.json).
set -euo pipefail
cd "$(dirname "$0")/.."
INSTALL=0
WORK=""
for arg in "$@"; do
    case "$arg" in
        --install) INSTALL=1 ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "train_tiny.sh: error: unknown option $arg (expected --install or WORK_DIR)" >&2
            exit 2 ;;
        *) if [ -n "$WORK" ]; then
               echo "train_tiny.sh: error: one WORK_DIR only, got '$WORK' and '$arg'" >&2
               exit 2
           fi
           WORK="$arg" ;;
    esac
done
WORK="${WORK:-runs/tiny}"
unset TRITON_INTERPRET   # CPU training uses the vectorised PyTorch pool_pack, not the interpreter
if [ "$INSTALL" = 1 ]; then
    python -m vr_runtime.training tiny --work "$WORK" --ship --train 480 --heldout 60 \
        --results bench/results
    python -m vr_runtime.training routing-eval --data "$WORK/data/heldout_conversations.jsonl" \
        --out bench/results/routing_heldout.json
else
    python -m vr_runtime.training tiny --work "$WORK" --train 480 --heldout 60 \
        --results "$WORK/results"
    echo "trained weights: $WORK/stage3b/{model,routers}.safetensors; results: $WORK/results" \
         "(the shipped weights are unchanged; rerun with --install to replace them)" >&2
fi
