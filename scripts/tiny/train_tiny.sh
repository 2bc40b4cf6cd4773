#!/usr/bin/env bash
# Train the `tiny` preset from scratch on the synthetic evidence task: Stage 0 (tiny-only
# pretraining, vr_runtime/training/pretrain.py) -> Stages 1, 2, 3, 3b. The shipped weights are
# task v2's (the default): about 55 minutes on 2 CPU cores, summed from its parts (1,045 videos
# to write and encode, about 9 minutes; Stage 0 9; Stages 1-3b 31; the evaluations 5; the wall
# times are in training_metrics.json); task v1 about 20.
#
#   scripts/tiny/train_tiny.sh [--task v2|v1] [WORK_DIR]   (default v2, runs/tiny_v2; v1: runs/tiny)
#       v2: the wider task (aspect ratios, lossy codecs and noise, moving targets,
#       1-3 targets, 8-64 of 16-256 frames, look-alike distractors): 960 training videos with
#       every factor random, a held-out split of 85 that varies one factor at a time.
#       --task v1: the original task (square, near-lossless H.264, static, 2 targets, 16
#       frames), 480 training videos and 60 held out; the shipped weights before v2.
#       Everything goes under WORK_DIR: data, checkpoints, logs, the final weights
#       (WORK_DIR/stage3b/{model,routers}.safetensors) and the curves and metrics
#       (WORK_DIR/results/training_curves.png, training_metrics.json). Nothing in the checkout
#       changes.
#   scripts/tiny/train_tiny.sh --install [WORK_DIR]
#       the same, then replace the shipped weights (vr_runtime/assets/tiny/{model,routers}
#       .safetensors) and the committed results (studies/results/training_curves.png,
#       training_metrics.json), and measure the held-out routing metrics of the new shipped
#       weights (studies/results/routing_heldout.json; with --task v2
#       studies/results/routing_heldout_v2.json, per factor; routing_footage_v2.json on 20 videos
#       of the combined "footage" setting; routing_heldout.json on task v1's held-out split).
set -euo pipefail
cd "$(dirname "$0")/../.."
INSTALL=0
WORK=""
TASK=v2
EXPECT_TASK=0
for arg in "$@"; do
    if [ "$EXPECT_TASK" = 1 ]; then
        case "$arg" in
            v1|v2) TASK="$arg" ;;
            *) echo "train_tiny.sh: error: --task expects v1 or v2, got '$arg'" >&2; exit 2 ;;
        esac
        EXPECT_TASK=0
        continue
    fi
    case "$arg" in
        --install) INSTALL=1 ;;
        --task) EXPECT_TASK=1 ;;
        --task=v1|--task=v2) TASK="${arg#--task=}" ;;
        --task=*) echo "train_tiny.sh: error: --task expects v1 or v2, got '${arg#--task=}'" >&2
            exit 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ {print; next} NR > 1 {exit}' "$0" \
                       | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "train_tiny.sh: error: unknown option $arg (expected --install, --task or" \
                 "WORK_DIR)" >&2
            exit 2 ;;
        *) if [ -n "$WORK" ]; then
               echo "train_tiny.sh: error: one WORK_DIR only, got '$WORK' and '$arg'" >&2
               exit 2
           fi
           WORK="$arg" ;;
    esac
done
if [ "$EXPECT_TASK" = 1 ]; then
    echo "train_tiny.sh: error: --task expects v1 or v2" >&2
    exit 2
fi
if [ "$TASK" = v2 ]; then
    WORK="${WORK:-runs/tiny_v2}"
    SIZES=(--task v2 --train 960 --heldout 85)   # 85 held-out: 5 per setting (17 settings)
    ROUTING=studies/results/routing_heldout_v2.json
else
    WORK="${WORK:-runs/tiny}"
    SIZES=(--train 480 --heldout 60)
    ROUTING=studies/results/routing_heldout.json
fi
unset TRITON_INTERPRET   # CPU training uses the vectorised PyTorch pool_pack, not the interpreter
if [ "$INSTALL" = 1 ]; then
    python -m vr_runtime.training tiny --work "$WORK" --ship "${SIZES[@]}" \
        --results studies/results
    python -m vr_runtime.training routing-eval --data "$WORK/data/heldout_conversations.jsonl" \
        --out "$ROUTING"
    if [ "$TASK" = v2 ]; then
        # the combined "footage" setting (every factor off its base at once)
        python -m vr_runtime.training synth --task v2 --out "$WORK/data" --train 0 --heldout 0 \
            --footage 20
        python -m vr_runtime.training routing-eval \
            --data "$WORK/data/footage_conversations.jsonl" \
            --out studies/results/routing_footage_v2.json
        # and on task v1's held-out split (the demo clip's kind: square, near-lossless, static),
        # so the v1 figures stay those of the shipped weights
        python -m vr_runtime.training synth --out "$WORK/data_v1" --train 0 --heldout 60
        python -m vr_runtime.training routing-eval \
            --data "$WORK/data_v1/heldout_conversations.jsonl" \
            --out studies/results/routing_heldout.json
    fi
else
    python -m vr_runtime.training tiny --work "$WORK" "${SIZES[@]}" \
        --results "$WORK/results"
    echo "trained weights: $WORK/stage3b/{model,routers}.safetensors; results: $WORK/results" \
         "(the shipped weights are unchanged; rerun with --install to replace them)" >&2
fi
