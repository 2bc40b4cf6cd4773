"""Does the tiny answerer bind the queried color to its own target? For each decoder layer and head,
the attention mass that the row predicting the answer (and the question's color word) puts on
the queried target's frames and on the video's *other* target's frames, under the dense plan
(every frame at full resolution) and a Fragment plan (the target's frames at full resolution, the
rest pooled 4x4), split by whether the greedy first answer token is right.

    python scripts/studies/binding_probe_tiny.py --models tiny runs/X/hf [--videos 10] \
        [--task v1|v2] [--out FILE]

Why: with route supervision the dense row still named the other target's shape in most of its
wrong answers (``dense_errors.py``). A head that reads both targets' frames alike (own ~ other)
cannot tell them apart; the color word's layer-0 heads, which read only their own color, can.
"""
import argparse
import json
import os
import random
import sys
from typing import Dict, List, Sequence

import torch


def frame_mass(att: torch.Tensor, row: int, frames: Sequence[int], dest: Sequence[int],
               counts: Sequence[int]) -> torch.Tensor:
    """[heads] attention of ``att`` ([heads, q, k]) at query ``row`` summed over the visual rows
    of ``frames`` (frame t: ``counts[t]`` rows from ``dest[t]``)."""
    out = att.new_zeros(att.shape[0])
    for t in frames:
        out = out + att[:, row, dest[t]:dest[t] + counts[t]].sum(-1)
    return out


def _spec(rng: random.Random, task: str):
    from vr_runtime.data import synthetic_videos as sv
    if task == "v2":
        return sv.sample_spec_v2(rng, dict(sv.BASE, frames="16/16"))
    return sv.sample_spec(rng)


@torch.no_grad()
def probe(model: str, videos: int, seed: int, task: str) -> dict:
    import vr_kernels
    from vr_kernels import pooled_counts
    from vr_runtime.backbones import load_backbone
    from vr_runtime.data import synthetic_videos as sv
    from vr_tiny.labeller import video_features
    from vr_tiny.route import RouteSupervision
    from vr_runtime.training.stages import answer_sequence
    bb = load_backbone(model, attn_implementation="eager")
    tok, rng = bb.tokenizer, random.Random(f"binding-probe-{seed}-{task}")
    acc: Dict[tuple, List[torch.Tensor]] = {}
    for _ in range(videos):
        spec = _spec(rng, task)
        T = spec.frames_sampled
        Z = bb.project(video_features(bb, spec))
        for color, shape in spec.targets:
            own = [t for t, y in enumerate(spec.target_labels(color)) if y]
            other = [t for c, _ in spec.targets if c != color
                     for t, y in enumerate(spec.target_labels(c)) if y]
            q = rng.choice(sv.phrasings("train")[0]).format(color=color)
            for name, plan in (("dense", [1] * T),
                               ("fragment", [1 if t in own else 4 for t in range(T)])):
                ids, n_prompt, dest, _ = answer_sequence(bb, q, shape, plan)
                ids = ids[:n_prompt]
                emb = bb.model.get_input_embeddings()(torch.tensor(ids))
                emb = vr_kernels.pool_pack(Z, plan, tuple(bb.grid), out=emb, dest=dest)
                out = bb.decoder()(inputs_embeds=emb[None], output_attentions=True,
                                   return_dict=True)
                first = tok(shape, add_special_tokens=False)["input_ids"][0]
                right = int(bb.lm_head()(out.last_hidden_state[0, -1]).argmax()) == first
                cue = max(i for i in range(n_prompt)
                          if ids[i] == RouteSupervision.cue_id(tok, color))
                counts = pooled_counts(plan, bb.grid)
                for layer, a in enumerate(out.attentions):
                    a = a[0].float()
                    for who, row in (("answer_row", n_prompt - 1), ("color_word", cue)):
                        for whose, fs in (("own", own), ("other", other)):
                            key = (name, "right" if right else "wrong", who, whose, layer)
                            acc.setdefault(key, []).append(frame_mass(a, row, fs, dest, counts))
    res: dict = {}
    for (name, right, who, whose, layer), vs in sorted(acc.items()):
        node = res.setdefault(name, {}).setdefault(right, {"questions": 0})
        node["questions"] = len(vs)
        node.setdefault(f"{who}_on_{whose}_target", {})[f"layer_{layer}"] = \
            [round(float(x), 3) for x in torch.stack(vs).mean(0)]
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny"])
    ap.add_argument("--videos", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--task", choices=("v1", "v2"), default="v1",
                    help="the data task: v1, the basic task (the synthetic eval's videos); "
                         "v2, the wide task's base setting, 16 frames")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.videos < 1:
        sys.exit(f"--videos: expected an int >= 1, got {args.videos}")
    for m in args.models:
        if m != "tiny" and not os.path.isdir(m):
            sys.exit(f"--models: {m!r} is not a directory (a model folder with config.json)")
    from vr_runtime.data.atomic import write_atomic
    from vr_runtime.fingerprint import environment
    res = {"what": "mean attention mass per head (list: heads 0..) of each decoder layer, from "
                   "the answer row and from the question's color word, on the queried target's "
                   "frames (own) and the other target's (other); dense: all frames at full "
                   "resolution, fragment: the target's frames full, the rest 4x4; split by "
                   "whether the greedy first answer token is right",
           "command": "python " + " ".join(sys.argv), **environment(),
           "videos": args.videos, "task": args.task,
           "models": {m: probe(m, args.videos, args.seed, args.task) for m in args.models}}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_atomic(args.out, json.dumps(res, indent=2))   # whole or not at all, even if killed
    for m, r in res["models"].items():
        print(m, {name: {k: v["questions"] for k, v in d.items()} for name, d in r.items()})


if __name__ == "__main__":
    main()
