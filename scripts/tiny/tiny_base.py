"""Save the tiny preset's deterministic fill -- the backbone the tiny Stage 3 started from,
before any fine-tuning (the vision tower stays this fill through every stage) -- as a Hugging
Face directory, the starting point of the Data FT control (tiny_data_ft.json).

    python scripts/tiny/tiny_base.py runs/tiny/base/hf
"""
import json
import sys

import torch
from transformers import InternVLConfig, InternVLForConditionalGeneration

from vr_runtime.backbones.tiny import ASSETS, init_weights_, load_tiny_tokenizer


def main(out: str) -> None:
    cfg = InternVLConfig.from_dict(json.loads((ASSETS / "config.json").read_text()))
    with torch.device("cpu"):
        model = InternVLForConditionalGeneration._from_config(cfg, dtype=torch.float32)
    init_weights_(model, 0)   # what InternVL3Backbone.tiny() uses when no weights are shipped
    model.save_pretrained(out, safe_serialization=True)
    load_tiny_tokenizer().save_pretrained(out)
    print(out)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/tiny/base/hf")
