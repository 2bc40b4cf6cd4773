"""Run one Stage 0 variant (tiny-only) and record its held-out metrics.

    python scripts/studies/stage0_variant.py NAME '{"shape_query_prob": 0.5, "steps": 400}'

trains ``tiny_stage0`` with the given overrides into ``runs/stage0_variants/NAME`` and writes
its metrics, config, environment and command under NAME in
``studies/results/stage0/stage0_variants.json`` (other entries are kept). These are the measurements
behind the variant tables of docs/TRAINING_STUDIES.md (Stage 0, and recipe v8's Stage 0 with
longer captions, ``tiny_stage0b``, which the shipped v9 weights use).
"""
import json
import os
import sys

from vr_runtime.fingerprint import environment
from vr_runtime.training.config import ConfigError
from vr_tiny.pretrain import PretrainConfig, pretrain

RESULTS = "studies/results/stage0/stage0_variants.json"


def main(argv):
    if len(argv) not in (1, 2):
        sys.exit("usage: python scripts/studies/stage0_variant.py NAME ['{\"key\": value, ...}']")
    name = argv[0]
    try:
        overrides = json.loads(argv[1]) if len(argv) == 2 else {}
    except json.JSONDecodeError as e:
        sys.exit(f"overrides: not JSON ({e}); pass an object such as '{{\"steps\": 400}}'")
    if not isinstance(overrides, dict):
        sys.exit("overrides: expected a JSON object such as '{\"steps\": 400}'")
    try:
        cfg = PretrainConfig.load("tiny_stage0", output_dir=f"runs/stage0_variants/{name}",
                                  **overrides)
    except ConfigError as e:
        sys.exit(f"overrides: {e}")
    res = pretrain(cfg)
    entry = dict(environment(), command="python scripts/studies/stage0_variant.py " + " ".join(
        [name] + [f"'{a}'" for a in argv[1:]]), overrides=overrides, **res)
    table = {}
    if os.path.isfile(RESULTS):
        with open(RESULTS) as f:
            table = json.load(f)
    table[name] = entry
    tmp = RESULTS + ".tmp"
    with open(tmp, "w") as f:
        json.dump(table, f, indent=2)
    os.replace(tmp, RESULTS)   # never a half-written results file
    print(json.dumps({name: res["metrics"]}, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
