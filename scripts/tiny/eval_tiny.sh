#!/usr/bin/env bash
# The tiny analogue of the paper's controlled comparison (studies/results/eval_synthetic_tiny/):
# every method at two fixed visual budgets on a synthetic Video-MME-layout benchmark, CPU.
#   1. the Data FT control: Stage 3's recipe with uniform pooling, no routing
#      (vr_tiny/configs/tiny_data_ft.json, from the backbone Stage 3 started from)
#   2. a tiny *random* CLIP (no pretrained CLIP can be fetched here: the clip row checks the
#      plumbing, not CLIP's relevance)
#   3. the benchmark and the evaluation (resumable: rerun to continue)
set -euo pipefail
cd "$(dirname "$0")/../.."
W=${WORK:-runs/tiny}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
[ -f "$W/data/train_conversations.jsonl" ] || \
    python -m vr_tiny synth --out "$W/data" --train 160 --heldout 40
[ -f "$W/base/hf/config.json" ] || python scripts/tiny/tiny_base.py "$W/base/hf"
[ -f "$W/data_ft/hf/config.json" ] || \
    python -m vr_tiny stage --config tiny_data_ft --no-progress \
        --set model="$W/base/hf" output_dir="$W/data_ft" \
        train_data="$W/data/train_conversations.jsonl" eval_data="$W/data/heldout_conversations.jsonl"
[ -f "$W/clip_random/config.json" ] || \
    python -c "from vr_runtime.eval.synthetic import make_random_clip as m; m('$W/clip_random')"
python -m vr_runtime.eval --make-synthetic "$W/videomme_syn" --videos-per-split 12
# Two prompt styles, the same methods, budgets and scoring (option-text: the tiny model answers
# words, not letters). bare: the LLM reads the question alone, as in its training (the headline
# table); mc: lmms-eval's multiple-choice prompt, which the tiny models never saw in training.
for style in bare mc; do
    # (the mc run's committed files left the tree: eval_synthetic_tiny_mc/ at commit 89a6471)
    out=studies/results/eval_synthetic_tiny; [ "$style" = mc ] && out="$W/eval_synthetic_tiny_mc"
    python -m vr_runtime.eval --benchmark videomme --data "$W/videomme_syn/videomme" \
        --videos "$W/videomme_syn/data" \
        --methods dense,budget,budget-subset,uniform,global,fragment,auto,auto-literal,clip,clip-fill,no-image-router,no-image-router-routed,no-semantic-router,data-ft \
        --budgets 1024,2048 --frames 16 --clip "$W/clip_random" --data-ft-model "$W/data_ft/hf" \
        --prompt-style "$style" --answer-mode option-text --max-new-tokens 8 --out "$out" \
        --title "Synthetic Video-MME layout, tiny model, CPU, prompt $style: accuracy vs visual tokens"
done
