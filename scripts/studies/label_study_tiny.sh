#!/usr/bin/env bash
# Rule (a) on the synthetic task, end to end: the paper's frame labels (rule (a), Appendix A) built by
# the tiny model, compared with the generator's labels, then Stage 1 trained from them.
#   1. the labeller (python -m vr_tiny labeller, config tiny_labeller): the shipped
#      tiny model fine-tuned on fresh rendered videos to answer from whatever frames it is shown
#      (random plans that drop frames), as the pretrained VLM the paper labels with does;
#   2. label-study: rule (a) at the paper's reference (every frame at full resolution, ablation
#      by dropping, margin 1 nat, the validation filter correcting the labels) on 80 synthetic
#      videos -> studies/results/label_study/label_study.json and STUDY/counterfactual_relevance.jsonl;
#   3. Stage 1 from those labels vs from the generator's -> studies/results/label_study/stage1_from_labels.json;
#   then steps 2-3 again with --rule minimal-set. About 50 minutes on 2 CPU cores in all.
#   scripts/studies/label_study_tiny.sh [TINY_DIR] [STUDY_DIR]   (defaults runs/tiny_v2, runs/label_study;
#   TINY_DIR is a finished scripts/tiny/train_tiny.sh run: its data, and Stage 0's model for step 3)
set -euo pipefail
cd "$(dirname "$0")/../.."
TINY="${1:-runs/tiny_v2}"
STUDY="${2:-runs/label_study}"
unset TRITON_INTERPRET   # CPU training uses the vectorised PyTorch pool_pack, not the interpreter
for path in "$TINY/stage0/hf" "$TINY/data/train_conversations.jsonl"; do
    if [ ! -e "$path" ]; then
        echo "label_study_tiny.sh: $path not found; run scripts/tiny/train_tiny.sh $TINY first" >&2
        exit 2
    fi
done
python -m vr_tiny labeller --config tiny_labeller --no-progress \
    --set "output_dir=$TINY/labeller" --results studies/results/label_study/labeller_tiny.json
python -m vr_tiny label-study --model "$TINY/labeller/hf" --work "$STUDY" \
    --results studies/results/label_study/label_study.json --videos-count 80 --mode drop --margin 1.0
python scripts/studies/stage1_from_labels.py --study "$STUDY" --tiny "$TINY"
# The same with --rule minimal-set: the validated greedy sets alone, without single-frame
# necessity (whose single-frame drops add false positives; see the training README).
python -m vr_tiny label-study --model "$TINY/labeller/hf" --work "$STUDY-minimal-set" \
    --results studies/results/label_study/label_study_minimal_set.json --videos-count 80 --mode drop \
    --margin 1.0 --rule minimal-set
python scripts/studies/stage1_from_labels.py --study "$STUDY-minimal-set" --tiny "$TINY" \
    --out studies/results/label_study/stage1_from_labels_minimal_set.json
# Where the shipped model and the labeller look (the reason for the labeller's route supervision).
python scripts/studies/attention_probe_tiny.py --models tiny "$TINY/labeller/hf"
