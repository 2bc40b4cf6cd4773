#!/usr/bin/env python3
"""Regenerate ``vr_runtime/assets/tiny/{tokenizer.json,config.json}``.

The tokenizer is a byte-level BPE trained with the ``tokenizers`` library on the small corpus
below (the vocabulary of the synthetic "coloured objects in frames" QA task plus common English),
so it is built locally and is the same on every machine that runs this script with the same
``tokenizers`` version. The shipped files are what the runtime loads; this script only exists
so that they can be rebuilt and reviewed. Weights are not written here: ``vr_runtime.backbones.tiny``
initialises them from a fixed seed unless trained ``model.safetensors`` is present.

    python scripts/tiny/make_tiny_assets.py [--out vr_runtime/assets/tiny]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from vr_runtime.backbones.internvl3 import tiny_config_dict  # noqa: E402
from vr_runtime.backbones.tiny import SPECIAL_TOKENS  # noqa: E402

VOCAB_SIZE = 1024

COLORS = "red green blue yellow orange purple white black pink brown gray grey cyan magenta".split()
SHAPES = ("circle square triangle star diamond rectangle hexagon ball box cube cross ring "
          "heart arrow line dot object objects shape shapes").split()
NUMBERS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
           "fourteen fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty "
           "sixty seventy eighty ninety hundred first second third fourth fifth last").split()
WORDS = ("frame frames video clip scene image picture which what where when who how many much "
         "does do did is are was were the a an of in on at to from with and or not no yes "
         "appear appears appeared show shows shown visible see seen color colour kind type "
         "left right top bottom middle center corner before after during between both all any "
         "each every only most least more less first last number count total time second "
         "seconds minute start end beginning happen happens moving move moves stay stays "
         "large small big tiny bright dark answer question option options choose correct "
         "man woman person people dog cat car tree house table chair hand pick picks up down "
         "it its this that these those there here than then same different other another "
         "please answer with a single word letter A B C D E").split()

CORPUS_TEMPLATES = [
    "Which color is the {shape} in frame {n}?",
    "What shape appears in the {color} frames?",
    "How many frames show a {color} {shape}?",
    "Does a {color} {shape} appear in the video?",
    "In which frame does the {color} {shape} appear first?",
    "Answer: {color}. Answer: {shape}. Answer: {num}. Answer: yes. Answer: no.",
    "The {color} {shape} is visible in the {num} frame of the video.",
    "Frame{n}: a {color} {shape} on the left, a {color2} {shape2} on the right.",
]


def corpus() -> list:
    lines = [" ".join(COLORS), " ".join(SHAPES), " ".join(NUMBERS), " ".join(WORDS)]
    lines.append(" ".join(str(i) for i in range(0, 130)))
    for i, tpl in enumerate(CORPUS_TEMPLATES):
        for j in range(len(COLORS) * 2):
            lines.append(tpl.format(
                color=COLORS[j % len(COLORS)], color2=COLORS[(j * 5 + i) % len(COLORS)],
                shape=SHAPES[(j + i) % len(SHAPES)], shape2=SHAPES[(j * 3 + 1) % len(SHAPES)],
                num=NUMBERS[(j + 2 * i) % len(NUMBERS)], n=1 + (j * 7 + i) % 64))
    # Capitalised forms so the start of a question does not shatter into bytes.
    lines.append(" ".join(w.capitalize() for w in COLORS + SHAPES + WORDS[:80]))
    return lines


def build_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, min_frequency=1, show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "vr_runtime" / "assets" / "tiny"))
    args = ap.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    tok.save(str(out / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    cfg = tiny_config_dict(vocab_size=tok.get_vocab_size(), special_ids=ids)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    print(f"wrote {out}/tokenizer.json (vocab {tok.get_vocab_size()}) and config.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
