#!/usr/bin/env bash
# Train the `tiny` preset from scratch on the synthetic evidence task and ship the weights:
# Stage 0 (tiny-only pretraining, vr_runtime/training/pretrain.py) -> Stages 1, 2, 3, 3b ->
# vr_runtime/assets/tiny/{model,routers}.safetensors, bench/results/training_curves.png and
# bench/results/training_metrics.json; then issue 8's held-out routing metrics of the shipped
# weights -> bench/results/routing_heldout.json. About 20 minutes on 2 CPU cores (see the
# wall times in training_metrics.json).
#   scripts/train_tiny.sh [WORK_DIR]        (default runs/tiny; data + checkpoints + logs there)
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${1:-runs/tiny}"
unset TRITON_INTERPRET   # CPU training uses the vectorised PyTorch pool_pack, not the interpreter
python -m vr_runtime.training tiny --work "$WORK" --ship --train 480 --heldout 60
python -m vr_runtime.training routing-eval --data "$WORK/data/heldout_conversations.jsonl" \
    --out bench/results/routing_heldout.json
