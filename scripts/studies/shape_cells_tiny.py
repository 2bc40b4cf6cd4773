"""Where is an object's shape in the tiny model's projected tokens? A linear shape readout
(logistic regression, held-out frames) from four means over a frame's tokens: the object's
interior cells (covered >= 99%), its boundary cells (covered in part), coverage-weighted (Stage
0's phase A readout), and the whole frame.

    python scripts/studies/shape_cells_tiny.py [--model tiny] [--train 1200] [--test 400] \
        [--out studies/results/v7_steps/shape_cells.json]

Why: a color word's attention picks the tokens of its color, the interior cells most; if those
carry no shape, a color-gated read returns the color without the shape, and a dense answerer
names whichever target's shape it reads elsewhere.
"""
import argparse
import json
import random
import sys

import torch


def frames(n: int, seed: int):
    """n one-object frames drawn as the synthetic eval's targets are (radius 0.25-0.29)."""
    from vr_runtime.data.synthetic_videos import BACKGROUNDS, COLORS, SHAPES, Shape, VideoSpec
    rng, out = random.Random(f"shape-cells-{seed}"), []
    for _ in range(n):
        s = VideoSpec(num_frames=1, size=448, background=rng.choice(sorted(BACKGROUNDS)))
        r = int(rng.uniform(0.25, 0.29) * 448)
        s.shapes.append(Shape(0, rng.choice(SHAPES), rng.choice(sorted(COLORS)),
                              rng.randint(r + 4, 443 - r), rng.randint(r + 4, 443 - r), r))
        out.append(s)
    return out


@torch.no_grad()
def means(bb, specs, V, projected: bool = True):
    """{kind: [n, D] means of the projected tokens (or, ``projected`` False, of the tower's
    features ``V`` of ``specs`` before the projector)}, shape targets [n]."""
    from vr_runtime.training.pretrain import object_coverage
    Z = bb.project(V) if projected else V
    rows = {k: [] for k in ("interior", "boundary", "coverage", "frame")}
    y = []
    for z, s in zip(Z, specs):
        cov, _, shape = object_coverage(s)[0]
        y.append(shape)
        weights = {"interior": (cov >= 0.99).float(),
                   "boundary": ((cov > 0) & (cov < 0.99)).float(),
                   "coverage": cov, "frame": torch.ones_like(cov)}
        for k, w in weights.items():
            rows[k].append((z * (w / w.sum())[:, None]).sum(0))
    return {k: torch.stack(v) for k, v in rows.items()}, torch.tensor(y)


def readout(xtr, ytr, xte, yte, steps: int = 1500) -> float:
    """Held-out accuracy of a logistic regression on standardised features."""
    torch.manual_seed(0)
    mu, sd = xtr.mean(0), xtr.std(0) + 1e-6
    xtr, xte = (xtr - mu) / sd, (xte - mu) / sd
    lin = torch.nn.Linear(xtr.shape[1], int(ytr.max()) + 1)
    opt = torch.optim.Adam(lin.parameters(), 1e-2, weight_decay=1e-4)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(lin(xtr), ytr).backward()
        opt.step()
    with torch.no_grad():
        return float((lin(xte).argmax(-1) == yte).float().mean())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--train", type=int, default=1200)
    ap.add_argument("--test", type=int, default=400)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.train < 30 or a.test < 30:
        sys.exit(f"--train/--test: expected >= 30 frames each, got {a.train}/{a.test}")
    from vr_runtime.backbones import load_backbone
    bb = load_backbone(a.model)
    from vr_runtime.training.pretrain import frame_features
    tr, te = frames(a.train, 0), frames(a.test, 1)
    with torch.no_grad():       # the tower once per split; both readouts use its features
        vtr, vte = frame_features(bb, tr).float(), frame_features(bb, te).float()
    res = {"what": "held-out linear shape readout (3 shapes, chance 1/3) from each mean of an "
                   "object's tokens, after the projector and before it (the vision tower's "
                   "features)", "command": "python " + " ".join(sys.argv),
           "model": a.model, "frames": {"train": a.train, "test": a.test}}
    for name, projected in (("projected", True), ("tower", False)):
        (xtr, ytr), (xte, yte) = means(bb, tr, vtr, projected), means(bb, te, vte, projected)
        res[name] = {k: round(readout(xtr[k], ytr, xte[k], yte), 3) for k in xtr}
        print(name, json.dumps(res[name]), flush=True)
    if a.out:
        from vr_runtime.data.atomic import write_atomic
        write_atomic(a.out, json.dumps(res, indent=2))   # whole or not at all, even if killed


if __name__ == "__main__":
    main()
