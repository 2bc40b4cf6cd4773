#!/usr/bin/env bash
# Train the `tiny` preset on the synthetic evidence task (CPU, ~20-40 min on 2 busy cores) and
# ship the weights: vr_runtime/assets/tiny/{model,routers}.safetensors, plus
# bench/results/training_curves.png and bench/results/training_metrics.json.
#   scripts/train_tiny.sh [WORK_DIR]        (default runs/tiny; data + checkpoints + logs there)
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${1:-runs/tiny}"
unset TRITON_INTERPRET   # CPU training uses the vectorised PyTorch pool_pack, not the interpreter
python -m vr_runtime.training tiny --work "$WORK" --ship --train 480 --heldout 60
