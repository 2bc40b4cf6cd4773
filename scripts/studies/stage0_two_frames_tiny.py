"""Does a Stage 0 model's binding hold across frames? Stage 0 captions one frame at a time; the
dense row asks about two targets in different frames. Here each prompt is two one-object frames
of different colors and shapes, ``[Z_a; Z_b; caption]`` (Stage 0's own layout, two frames instead
of one), and the caption names all six colors; the measure is the shape named after each of the
two present colors (a shape named without its color is a coin), at full resolution.

    python scripts/studies/stage0_two_frames_tiny.py --models runs/stage0_variants/shipped_rerun/hf \
        runs/stage0_variants/captions_6400/hf [--pairs 200] [--out FILE]
"""
import argparse
import json
import random
import sys

import torch


def pairs(n: int, seed: int):
    """n pairs of big one-object frames whose objects differ in color and in shape."""
    from vr_runtime.data.synthetic_videos import BACKGROUNDS, COLORS, SHAPES, Shape, VideoSpec
    rng, out = random.Random(f"two-frames-{seed}"), []
    for _ in range(n):
        colors, shapes = rng.sample(sorted(COLORS), 2), rng.sample(SHAPES, 2)
        bg = rng.choice(sorted(BACKGROUNDS))
        pair = []
        for color, shape in zip(colors, shapes):
            s = VideoSpec(num_frames=1, size=448, background=bg)
            r = int(rng.uniform(0.25, 0.29) * 448)
            s.shapes.append(Shape(0, shape, color, rng.randint(r + 4, 443 - r),
                                  rng.randint(r + 4, 443 - r), r))
            pair.append(s)
        out.append(pair)
    return out


@torch.no_grad()
def accuracy(model: str, frame_pairs, seed: int = 0) -> dict:
    """Shape named after each present color: right, and the other frame's shape instead."""
    from vr_runtime.backbones import load_backbone
    from vr_runtime.data.synthetic_videos import VideoSpec
    from vr_tiny.pretrain import CaptionTokens, caption, frame_features
    bb = load_backbone(model, dtype=torch.float32)
    bb.model.eval()
    toks, rng = CaptionTokens(bb.tokenizer), random.Random(seed)
    right = other = n = 0
    for a, b in frame_pairs:
        Z = bb.project(frame_features(bb, [a, b]))                        # [2, 256, D]
        both = VideoSpec(num_frames=1, size=448, shapes=a.shapes + b.shapes)
        ids, tgt = toks.encode(caption(both, rng, "color"))
        x = torch.cat([Z.reshape(1, -1, Z.shape[-1]),
                       bb.model.get_input_embeddings()(torch.tensor([ids]))], 1)
        logits = bb.forward(inputs_embeds=x, logits_to_keep=len(ids)).logits[0]
        shapes = {s.shape for s in both.shapes}
        for pos, t in enumerate(tgt):
            if t != -100 and t != toks.ids["no"]:
                pred = int(logits[pos].argmax())
                right += pred == t
                other += pred != t and pred in {toks.ids[s] for s in shapes}
                n += 1
    return {"model": model, "queries": n, "binding_accuracy": round(right / n, 3),
            "other_shape": round(other / n, 3)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", required=True)
    ap.add_argument("--pairs", type=int, default=200)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.pairs < 10:
        sys.exit(f"--pairs: expected >= 10, got {a.pairs}")
    frame_pairs = pairs(a.pairs, 0)
    res = {"what": "two one-object frames of different colors and shapes, [Z_a; Z_b; caption]: "
                   "the shape named after each present color (chance between the two 50%)",
           "command": "python " + " ".join(sys.argv), "pairs": a.pairs,
           "results": [accuracy(m, frame_pairs) for m in a.models]}
    print(json.dumps(res["results"], indent=1))
    if a.out:
        from vr_runtime.data.atomic import write_atomic
        write_atomic(a.out, json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
