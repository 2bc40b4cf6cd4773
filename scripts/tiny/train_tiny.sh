#!/usr/bin/env bash
# Train the `tiny` preset from scratch on the synthetic evidence task: Stage 0 (tiny-only
# pretraining, vr_tiny/pretrain.py) -> Stages 1, 2, 3, 3b [, 3c [, 3d | 3e, 3f]].
# --task vN picks the recipe vN (v1 to v9: the stages, configs and data sizes; "the vN weights"
# are what it trains). The shipped weights are recipe v9's (the default): recipe v8's Stage 0
# and stages with every shape answer colour first (about 85 minutes on 2 CPU cores from
# scratch, the data's writing aside; docs/TRAINING_STUDIES.md, "Shipped tiny weights (recipe
# v9)"). Recipe v5's (shipped before) is recipe v3's plus Stages 3e and 3f (about 35 minutes on
# top of recipe v3's run). Recipe v3's is recipe v2's run (about 55 minutes on 2 CPU cores,
# summed from its parts: 1,045 videos to write and encode, about 9 minutes; Stage 0 9; Stages
# 1-3b 31; the evaluations 5) plus Stage 3c (the wall times are in training_metrics.json).
# Recipe v1 trains on the basic synthetic task (`synth --task v1`), every later recipe on the
# wide one (`synth --task v2`); docs/TRAINING_STUDIES.md says which word means what.
#
#   scripts/tiny/train_tiny.sh [--task v9|v8|v6|v5|v4|v3|v2|v1] [--from-v2 DIR | --from-v3 DIR |
#                              --from-v5 DIR] [WORK_DIR]
#       (default v9, runs/tiny_v9; v8: runs/tiny_v8; v6: runs/tiny_v6; v5: runs/tiny_v5;
#       v4: runs/tiny_v4; v3: runs/tiny_v3; v2: runs/tiny_v2; v1: runs/tiny)
#       v2: the wide task (aspect ratios, lossy codecs and noise, moving targets,
#       1-3 targets, 8-64 of 16-256 frames, look-alike distractors): 960 training videos with
#       every factor random, a held-out split of 85 that varies one factor at a time.
#       v3: v2, then Stage 3c (vr_tiny/configs/tiny_stage3c.json): Stage 3b continued with
#       dense layouts (every frame at full resolution) and long ones (the examples stretched
#       to 128-2,048 frames, planned as long videos are; vr_tiny/layouts.py), on
#       the first 320 training videos. --from-v2 DIR starts Stage 3c from a finished v2 model
#       (DIR holds config.json, model.safetensors, tokenizer.json and routers.safetensors, as
#       vr_runtime/assets/tiny/ did for the v2 weights) instead of training Stages 0-3b.
#       v4: v3, then Stage 3d (vr_tiny/configs/tiny_stage3d.json): Stage 3c continued for
#       400 steps with route supervision (vr_tiny/route.py: one head trained to
#       look from each answer at the question's color word) over dense dialogues (every
#       question about the same full-resolution frames in one sequence). --from-v3 DIR starts
#       Stage 3d from a finished v3 model (as --from-v2 does for Stage 3c). Not shipped: it
#       lifts the dense answers but costs long prompts (docs/TRAINING_STUDIES.md, recipe v4).
#       v5 (shipped before v9): v3, then Stage 3e (vr_tiny/configs/tiny_stage3e.json:
#       Stage 3d's settings on every training video, not the first 320) and Stage 3f
#       (tiny_stage3f.json: 3e continued, a second seed). --from-v3 DIR starts Stage 3e from a
#       finished v3 model; --from-v3 without --task means v5.
#       v6: v5, then Stage 3g (tiny_stage3g.json: 3f's settings on 2,880 training videos, the
#       960 and 1,920 more drawn with another seed into WORK_DIR/data_more). --from-v5 DIR
#       starts Stage 3g from a finished v5 model. Not shipped: one question more on the dense
#       answers (docs/TRAINING_STUDIES.md, recipe v6).
#       v8: v5's stages from a longer Stage 0 (vr_tiny/configs/tiny_stage0b.json: its
#       captions eight times as long, so the LLM binds a color to its shape before Stage 1;
#       docs/TRAINING_STUDIES.md, recipe v8). From scratch only. Not shipped: its dense answers
#       stayed at 85%. (v7 was a study of the dense answers with no recipe of its own.)
#       v9: v8, with every shape answer of Stages 3-3f naming its color first ("red circle":
#       the shape is then read from the color word's own row, the binding Stage 0's captions
#       train), Stage 3 on dense dialogues with captions from its first step, and captions in
#       Stages 3e and 3f (vr_tiny/recipe.py, STAGE_SETTINGS;
#       docs/TRAINING_STUDIES.md, recipe v9). From scratch only. The shipped weights.
#       v1: the basic task (square, near-lossless H.264, static, 2 targets, 16 frames), 480
#       training videos and 60 held out.
#       Everything goes under WORK_DIR: data, checkpoints, logs, the final weights
#       (WORK_DIR/stage3g/ for v6, stage3f/ for v5, v8 and v9, stage3d/ for v4, stage3c/ for v3,
#       stage3b/ otherwise: {model,routers}.safetensors) and the curves and metrics
#       (WORK_DIR/results/training_curves.png, training_metrics.json).
#       Nothing in the checkout changes.
#   scripts/tiny/train_tiny.sh --install [...]
#       the same, then replace the shipped weights (vr_runtime/assets/tiny/{model,routers}
#       .safetensors) and write the committed results of the new shipped weights into
#       studies/results/shipped_vN/ (vN the recipe): training_curves.png and
#       training_metrics.json, and the held-out routing metrics: routing_wide_heldout.json
#       (the wide task's held-out split, per factor), routing_wide_footage.json (20 videos of
#       its combined "footage" setting) and routing_basic_heldout.json (the basic task's
#       held-out split); with --task v1 only routing_basic_heldout.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
INSTALL=0
WORK=""
TASK=v9
TASK_SET=0
FROM=""
FROM_FLAG=""
EXPECT=""
for arg in "$@"; do
    if [ "$EXPECT" = task ]; then
        case "$arg" in
            v1|v2|v3|v4|v5|v6|v8|v9) TASK="$arg"; TASK_SET=1 ;;
            *) echo "train_tiny.sh: error: --task expects v1 to v6, v8 or v9, got '$arg'" >&2
               exit 2 ;;
        esac
        EXPECT=""
        continue
    fi
    if [ "$EXPECT" = from-v2 ] || [ "$EXPECT" = from-v3 ] || [ "$EXPECT" = from-v5 ]; then
        FROM="$arg"
        FROM_FLAG="$EXPECT"
        EXPECT=""
        continue
    fi
    case "$arg" in
        --install) INSTALL=1 ;;
        --task) EXPECT=task ;;
        --from-v2|--from-v3|--from-v5) EXPECT="${arg#--}" ;;
        --task=v[1-689]) TASK="${arg#--task=}"; TASK_SET=1 ;;
        --task=*) echo "train_tiny.sh: error: --task expects v1 to v6, v8 or v9, got" \
                       "'${arg#--task=}'" >&2
            exit 2 ;;
        --from-v2=*|--from-v3=*|--from-v5=*) FROM="${arg#*=}"; FROM_FLAG="${arg%%=*}"
            FROM_FLAG="${FROM_FLAG#--}" ;;
        -h|--help) awk 'NR > 1 && /^#/ {print; next} NR > 1 {exit}' "$0" \
                       | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "train_tiny.sh: error: unknown option $arg (expected --install, --task," \
                 "--from-v2, --from-v3, --from-v5 or WORK_DIR)" >&2
            exit 2 ;;
        *) if [ -n "$WORK" ]; then
               echo "train_tiny.sh: error: one WORK_DIR only, got '$WORK' and '$arg'" >&2
               exit 2
           fi
           WORK="$arg" ;;
    esac
done
if [ -n "$EXPECT" ]; then
    echo "train_tiny.sh: error: --$EXPECT expects a value" >&2
    exit 2
fi
if [ "$FROM_FLAG" = from-v2 ] && [ "$TASK_SET" = 0 ]; then
    TASK=v3   # a v2 model starts Stage 3c, recipe v3's own stage
fi
if [ "$FROM_FLAG" = from-v2 ] && [ "$TASK" != v3 ]; then
    echo "train_tiny.sh: error: --from-v2 starts Stage 3c, which only recipe v3 has" >&2
    exit 2
fi
if [ "$FROM_FLAG" = from-v5 ] && [ "$TASK_SET" = 0 ]; then
    TASK=v6   # a v5 model starts Stage 3g, recipe v6's own stage
fi
if [ "$FROM_FLAG" = from-v5 ] && [ "$TASK" != v6 ]; then
    echo "train_tiny.sh: error: --from-v5 starts Stage 3g, which only recipe v6 has" >&2
    exit 2
fi
if [ "$FROM_FLAG" = from-v3 ] && [ "$TASK_SET" = 0 ]; then
    TASK=v5   # a v3 model starts Stage 3e, recipe v5's own stage
fi
if [ "$FROM_FLAG" = from-v3 ] && [ "$TASK" != v4 ] && [ "$TASK" != v5 ]; then
    echo "train_tiny.sh: error: --from-v3 starts Stage 3d or 3e, which only recipes v4 and v5" \
         "have" >&2
    exit 2
fi
SHIPPED="studies/results/shipped_$TASK"   # what --install writes (studies/results/README.md)
if [ "$TASK" != v1 ]; then
    WORK="${WORK:-runs/tiny_$TASK}"
    # 85 held-out: 5 per setting (17 settings)
    SIZES=(--task "$TASK" --train 960 --heldout 85 ${FROM:+--from-model "$FROM"})
    ROUTING="$SHIPPED/routing_wide_heldout.json"
else
    WORK="${WORK:-runs/tiny}"
    SIZES=(--train 480 --heldout 60)
    ROUTING="$SHIPPED/routing_basic_heldout.json"
fi
unset TRITON_INTERPRET   # CPU training uses the vectorised PyTorch pool_pack, not the interpreter
if [ "$INSTALL" = 1 ]; then
    python -m vr_tiny tiny --work "$WORK" --ship "${SIZES[@]}" \
        --results "$SHIPPED"
    python -m vr_tiny routing-eval --data "$WORK/data/heldout_conversations.jsonl" \
        --out "$ROUTING"
    if [ "$TASK" != v1 ]; then
        # the combined "footage" setting (every factor off its base at once)
        python -m vr_tiny synth --task v2 --out "$WORK/data" --train 0 --heldout 0 \
            --footage 20
        python -m vr_tiny routing-eval \
            --data "$WORK/data/footage_conversations.jsonl" \
            --out "$SHIPPED/routing_wide_footage.json"
        # and on the basic task's held-out split (the demo clip's kind: square, near-lossless,
        # static), so its figures stay those of the shipped weights
        python -m vr_tiny synth --out "$WORK/data_v1" --train 0 --heldout 60
        python -m vr_tiny routing-eval \
            --data "$WORK/data_v1/heldout_conversations.jsonl" \
            --out "$SHIPPED/routing_basic_heldout.json"
    fi
else
    python -m vr_tiny tiny --work "$WORK" "${SIZES[@]}" \
        --results "$WORK/results"
    LAST=stage3b
    [ "$TASK" = v3 ] && LAST=stage3c
    [ "$TASK" = v4 ] && LAST=stage3d
    [ "$TASK" = v5 ] && LAST=stage3f
    [ "$TASK" = v8 ] && LAST=stage3f
    [ "$TASK" = v9 ] && LAST=stage3f
    [ "$TASK" = v6 ] && LAST=stage3g
    echo "trained weights: $WORK/$LAST/{model,routers}.safetensors; results: $WORK/results" \
         "(the shipped weights are unchanged; rerun with --install to replace them)" >&2
fi
