#!/usr/bin/env bash
# Router pool 1 vs 2, retrained (docs/TRAINING_STUDIES.md, "Router pool 1 vs 2, retrained"): the
# tiny routers' Stages 1 and 2 (configs tiny_stage1 and tiny_stage2, as recipe v9 runs them) trained
# twice on top of the shipped tiny model (vr_runtime/assets/tiny/model.safetensors, the model the
# shipped routers run with), once with the Image Router on every token of Z_t (router_pool 1, the
# paper's input: 256 tokens a frame through the shadow stack) and once on Z_t pooled 2x2
# (router_pool 2, what the shipped routers were trained at: 64 tokens a frame); the data, the steps
# and the seed the same. Then routing-eval of each pair of routers, answers included, on the wide
# task's held-out split and its footage split, as scripts/tiny/train_tiny.sh evaluates the shipped
# routers.
#   1. synth --task v2 --train 960 --heldout 85 --footage 20 into WORK_DIR/data (recipe v9's sizes
#      and seed, --train N for fewer; videos already there are kept);
#   2. the vision features of Stage 1's videos into the feature cache (one Stage 1 step into
#      WORK_DIR/cache_fill), so that neither pool's Stage 1 time includes them;
#   3. per pool P (1, then 2): Stage 1 into WORK_DIR/poolP/stage1, Stage 2 from its routers into
#      WORK_DIR/poolP/stage2 (a stage whose folder holds metrics.json is reused: delete the folder
#      to retrain it);
#   4. the time a Stage 1 step of each pool from short runs made one after the other (step 3's
#      stages run tens of minutes apart, under whatever else the machine runs): 40 steps of pool 1,
#      of pool 2, of pool 1 and of pool 2 again (WORK_DIR/ab/poolP_R), each timed from its 10th
#      step to its 40th -> RESULTS_DIR/step_time_ab.json;
#   5. per pool: RESULTS_DIR/retrain_poolP/routing_wide_heldout.json and routing_wide_footage.json
#      (routing-eval, answers included; kept in WORK_DIR/poolP and reused from there) and
#      stages.json (each stage's held-out metrics, steps, wall time, the training loop's time and
#      the time a step).
# About 100 minutes on 2 shared CPU cores with --train 480 --steps 600 (the run recorded in
# docs/TRAINING_STUDIES.md, "Router pool 1 vs 2, retrained").
#   scripts/studies/router_pool_tiny.sh [--train N] [--steps N] [WORK_DIR] [RESULTS_DIR]
#       (defaults runs/router_pool_tiny, studies/results/router_pool; --train: the training videos
#       instead of recipe v9's 960, the first N of the same draw; --steps: Stage 1's steps for both
#       pools instead of tiny_stage1's 1,200)
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMAND="bash scripts/studies/router_pool_tiny.sh${*:+ $*}"   # for the results files
STEPS=""
TRAIN=960
ARGS=()
# number NAME VALUE: VALUE, a whole number >= 1, or one line and exit 2
number() {
    case "$2" in
        ''|*[!0-9]*|0*) echo "router_pool_tiny.sh: error: --$1 expects a number >= 1, got '$2'" >&2
                        exit 2 ;;
    esac
}
while [ "$#" -gt 0 ]; do
    case "$1" in
        -h|--help) awk 'NR > 1 && /^#/ {print; next} NR > 1 {exit}' "$0" | sed 's/^# \{0,1\}//'
                   exit 0 ;;
        --steps|--train)
            if [ "$#" -lt 2 ]; then
                echo "router_pool_tiny.sh: error: $1 expects a number" >&2
                exit 2
            fi
            number "${1#--}" "$2"
            if [ "$1" = --steps ]; then STEPS="$2"; else TRAIN="$2"; fi
            shift ;;
        --steps=*) STEPS="${1#--steps=}"; number steps "$STEPS" ;;
        --train=*) TRAIN="${1#--train=}"; number train "$TRAIN" ;;
        -*) echo "router_pool_tiny.sh: error: unknown option $1 (expected --steps N, --train N," \
                 "WORK_DIR or RESULTS_DIR)" >&2
            exit 2 ;;
        *) ARGS+=("$1") ;;
    esac
    shift
done
if [ "${#ARGS[@]}" -gt 2 ]; then
    echo "router_pool_tiny.sh: error: expected at most WORK_DIR and RESULTS_DIR, got" \
         "${#ARGS[@]}: ${ARGS[*]}" >&2
    exit 2
fi
WORK="${ARGS[0]:-runs/router_pool_tiny}"
RESULTS="${ARGS[1]:-studies/results/router_pool}"
DATA="$WORK/data"
unset TRITON_INTERPRET   # CPU training uses the vectorised PyTorch pool_pack, not the interpreter

python -m vr_tiny synth --task v2 --out "$DATA" --train "$TRAIN" --heldout 85 \
    --footage 20

# Stage 1's settings besides the pool: tiny_stage1.json's own (1,200 steps of 4 unless --steps,
# seed 42), on the data above, from the shipped model ("tiny"), no trackers.
STAGE1=(train_data="$DATA/train_relevance.jsonl" eval_data="$DATA/heldout_relevance.jsonl"
        model=tiny 'report_to=[]')
if [ ! -f "$WORK/cache_fill/metrics.json" ]; then
    python -m vr_tiny stage --config tiny_stage1 --no-progress --set "${STAGE1[@]}" \
        output_dir="$WORK/cache_fill" max_steps=1
fi
STEPS_SET=(${STEPS:+max_steps=$STEPS})   # the pools' Stage 1 only

# run_stage NAME DIR ARGS...: `stage` with ARGS unless DIR holds metrics.json; the wall time into
# DIR/wall_s.txt
run_stage() {
    local name="$1" dir="$2"
    shift 2
    if [ -f "$dir/metrics.json" ] && [ -f "$dir/wall_s.txt" ]; then
        echo "router_pool_tiny.sh: $name: reusing $dir" >&2
        return
    fi
    local t0
    mkdir -p "$dir"
    t0=$(date +%s.%N)
    python -m vr_tiny stage --no-progress "$@"
    python -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 1))" \
        "$t0" "$(date +%s.%N)" > "$dir/wall_s.txt"
}

for P in 1 2; do
    run_stage "pool $P stage 1" "$WORK/pool$P/stage1" --config tiny_stage1 --set "${STAGE1[@]}" \
        ${STEPS_SET[@]+"${STEPS_SET[@]}"} router_pool="$P" output_dir="$WORK/pool$P/stage1"
    run_stage "pool $P stage 2" "$WORK/pool$P/stage2" --config tiny_stage2 --set \
        train_data="$DATA/train_policy.jsonl" eval_data="$DATA/heldout_policy.jsonl" model=tiny \
        'report_to=[]' routers="$WORK/pool$P/stage1/routers.safetensors" router_pool="$P" \
        output_dir="$WORK/pool$P/stage2"
done

# The time a step, pool against pool: 40 steps each, alternating, the held-out evaluation cut to
# one example (its time is not counted)
for R in 1 2; do
    for P in 1 2; do
        if [ ! -f "$WORK/ab/pool${P}_$R/metrics.json" ]; then
            python -m vr_tiny stage --config tiny_stage1 --no-progress --set \
                "${STAGE1[@]}" router_pool="$P" max_steps=40 logging_steps=10 eval_limit=1 \
                output_dir="$WORK/ab/pool${P}_$R"
        fi
    done
done
mkdir -p "$RESULTS"
RP_COMMAND="$COMMAND" python - "$WORK/ab" "$RESULTS/step_time_ab.json" <<'EOF'
import json, os, platform, statistics, sys, time

import torch

ab, out = sys.argv[1], sys.argv[2]
runs = {}
for name in sorted(os.listdir(ab)):
    with open(os.path.join(ab, name, "log.jsonl")) as f:
        at = {r["step"]: r["elapsed_s"] for r in map(json.loads, filter(str.strip, f))}
    runs[name] = round((at[40] - at[10]) / 30, 4)
per_pool = {p: round(statistics.median(v for k, v in runs.items()
                                        if k.startswith(f"pool{p}_")), 4) for p in (1, 2)}
rec = {"what": "seconds a Stage 1 step (tiny_stage1: batch 4, 8 frames an example, the shadow "
               "stack's and the Image Router's forward, the Image Router's backward) at "
               "router_pool 1 and 2, from the 10th step to the 40th of four runs made one after "
               "the other, pool 1, 2, 1, 2 (scripts/studies/router_pool_tiny.sh, step 4)",
       "command": os.environ["RP_COMMAND"], "device": "cpu",
       "cpu": platform.machine(), "threads": torch.get_num_threads(),
       "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
       "python": platform.python_version(), "torch": torch.__version__,
       "s_per_step": runs, "median_s_per_step": {f"pool{p}": v for p, v in per_pool.items()},
       "pool1_over_pool2": round(per_pool[1] / per_pool[2], 3)}
with open(out, "w") as f:
    json.dump(rec, f, indent=2)
    f.write("\n")
print(json.dumps({k: rec[k] for k in ("s_per_step", "pool1_over_pool2")}, indent=2))
EOF

for P in 1 2; do
    OUT="$RESULTS/retrain_pool$P"
    mkdir -p "$OUT"
    for SPLIT in heldout footage; do
        if [ ! -f "$WORK/pool$P/routing_wide_$SPLIT.json" ]; then
            python -m vr_tiny routing-eval --data "$DATA/${SPLIT}_conversations.jsonl" \
                --routers "$WORK/pool$P/stage2/routers.safetensors" \
                --out "$WORK/pool$P/routing_wide_$SPLIT.json"
        fi
        cp "$WORK/pool$P/routing_wide_$SPLIT.json" "$OUT/"
    done
    RP_COMMAND="$COMMAND" python - "$WORK/pool$P" "$OUT/stages.json" "$P" <<'EOF'
import json, os, platform, sys, time

import torch

work, out, pool = sys.argv[1], sys.argv[2], int(sys.argv[3])
rec = {"what": f"the tiny routers' Stages 1 and 2 retrained at router_pool {pool} on top of the "
               "shipped tiny model (scripts/studies/router_pool_tiny.sh); per stage: held-out "
               "metrics, steps, wall time (the whole `stage` process: loading, training, "
               "saving, the held-out evaluation), the training loop's time (log.jsonl's last "
               "elapsed_s) and the time a step",
       "command": os.environ["RP_COMMAND"], "router_pool": pool,
       "device": "cpu", "cpu": platform.machine(), "threads": torch.get_num_threads(),
       "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
       "python": platform.python_version(), "torch": torch.__version__, "stages": {}}
for stage in ("stage1", "stage2"):
    d = os.path.join(work, stage)
    with open(os.path.join(d, "metrics.json")) as f:
        m = json.load(f)
    with open(os.path.join(d, "wall_s.txt")) as f:
        wall = float(f.read())
    with open(os.path.join(d, "log.jsonl")) as f:
        log = [json.loads(line) for line in f if line.strip()]
    cfg = m["config"]
    loop = log[-1]["elapsed_s"]
    rec["stages"][stage] = {
        "metrics": m["metrics"], "global_step": m["global_step"], "wall_s": wall,
        "train_loop_s": loop, "s_per_step": round(loop / m["global_step"], 4),
        "final_loss": log[-1].get("loss"),
        "config": {k: cfg.get(k) for k in (
            "model", "router_pool", "max_steps", "per_device_train_batch_size",
            "frames_per_example", "learning_rate", "seed", "train_data", "eval_data",
            "routers", "output_dir")}}
with open(out, "w") as f:
    json.dump(rec, f, indent=2)
    f.write("\n")
print(json.dumps({s: {k: v for k, v in e.items() if k not in ("config", "metrics")}
                  for s, e in rec["stages"].items()}, indent=2))
EOF
done
