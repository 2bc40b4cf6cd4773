"""Where the tiny model looks: the attention weight that each head of each decoder layer puts on
the queried target's tokens, from the question's color word and from the row that predicts the
answer, and (answer row) on the color word itself. Rendered synthetic videos, every frame at full
resolution (rule (a)'s reference) and, for comparison, only the target's frames kept.

    python scripts/studies/attention_probe_tiny.py [--models tiny runs/tiny/labeller/hf] [--videos 8] \
        [--out studies/results/label_study/labeller_attention_probe.json]

This is the measurement behind ``vr_tiny/labeller.py``'s route supervision (training
README, "The labeller"): the shipped model's color words already find their color among 16
frames, its answer row does not.
"""
import argparse
import json
import os
import random
import sys

import torch


def target_rows(spec, color, plan, dest, n, coverage=0.5):
    """Rows of the sequence that are the queried color's object (cell coverage > ``coverage``)."""
    from vr_runtime.data import synthetic_videos
    from vr_tiny.pretrain import object_coverage
    mask = torch.zeros(n)
    for t, w in enumerate(plan):
        if not w:
            continue
        shapes = [synthetic_videos.Shape(0, s.shape, s.color, s.cx, s.cy, s.r)
                  for s in spec.shapes if s.frame == t and s.color == color]
        one = synthetic_videos.VideoSpec(num_frames=1, size=spec.size, background=spec.background,
                                         shapes=shapes)
        for cov, _, _ in object_coverage(one):
            mask[dest[t]:dest[t] + 256] = (cov > coverage).float()
    return mask


@torch.no_grad()
def probe(model: str, videos: int, seed: int) -> dict:
    import vr_kernels
    from vr_runtime.backbones import load_backbone
    from vr_runtime.data import synthetic_videos
    from vr_tiny.labeller import video_features
    from vr_tiny.route import RouteSupervision
    from vr_runtime.training.stages import answer_sequence
    bb = load_backbone(model, attn_implementation="eager")
    rng = random.Random(f"attention-probe-{seed}")
    sums: dict = {}
    count: dict = {}
    for _ in range(videos):
        spec = synthetic_videos.sample_spec(rng)
        Z = bb.project(video_features(bb, spec))
        for color, shape in spec.targets:
            rel = spec.frames_with(color)
            q = rng.choice(synthetic_videos.phrasings("train")[0]).format(color=color)
            for name, plan in (("reference", [1] * spec.num_frames),
                               ("targets_only", [int(t in rel) for t in range(spec.num_frames)])):
                ids, n_prompt, dest, _ = answer_sequence(bb, q, shape, plan)
                ids = ids[:n_prompt]
                emb = bb.model.get_input_embeddings()(torch.tensor(ids))
                emb = vr_kernels.pool_pack(Z, plan, tuple(bb.grid), out=emb, dest=dest)
                att = bb.decoder()(inputs_embeds=emb[None], output_attentions=True,
                                   return_dict=True).attentions
                tgt = target_rows(spec, color, plan, dest, n_prompt)
                cue_id = RouteSupervision.cue_id(bb.tokenizer, color)
                cue = max(i for i in range(n_prompt) if ids[i] == cue_id)
                for layer, a in enumerate(att):
                    a = a[0].float()                                   # [heads, q, k]
                    vals = {"color_word_on_target": (a[:, cue] * tgt).sum(-1),
                            "answer_row_on_target": (a[:, -1] * tgt).sum(-1),
                            "answer_row_on_color_word": a[:, -1, cue]}
                    for what, v in vals.items():
                        key = (name, what, layer)
                        sums[key] = sums.get(key, 0) + v
                        count[key] = count.get(key, 0) + 1
    out: dict = {}
    for (name, what, layer), v in sorted(sums.items()):
        out.setdefault(name, {}).setdefault(what, {})[f"layer_{layer}"] = \
            [round(float(x), 3) for x in v / count[(name, what, layer)]]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "runs/tiny/labeller/hf"])
    ap.add_argument("--videos", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="studies/results/label_study/labeller_attention_probe.json")
    args = ap.parse_args(argv)
    if args.videos < 1:
        sys.exit(f"--videos: expected an int >= 1, got {args.videos}")
    for m in args.models:
        if m != "tiny" and not os.path.isdir(m):
            sys.exit(f"--models: {m!r} is not a directory (train it: python -m "
                     f"vr_tiny labeller)")
    from vr_runtime.data.atomic import write_atomic
    from vr_runtime.fingerprint import environment
    res = {"what": "mean attention weight per head (list: heads 0..3) of each decoder layer on the "
                   "queried target's tokens (cell coverage > 0.5), from the question's color word "
                   "and from the answer row, and of the answer row on the color word; rendered "
                   "synthetic videos, both targets asked, every frame at full resolution "
                   "('reference', 4,096 visual tokens) or only the target's frames kept",
           "command": "python " + " ".join(sys.argv), **environment(),
           "videos": args.videos, "questions": 2 * args.videos,
           "models": {m: probe(m, args.videos, args.seed) for m in args.models}}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_atomic(args.out, json.dumps(res, indent=2))   # whole or not at all, even if killed
    print(json.dumps({m: r["reference"] for m, r in res["models"].items()}, indent=1))


if __name__ == "__main__":
    main()
