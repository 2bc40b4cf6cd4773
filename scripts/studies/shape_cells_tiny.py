"""Where is an object's shape in the tiny model's projected tokens? A linear shape readout
(logistic regression, held-out frames) from four means over a frame's tokens: the object's
interior cells (covered >= 99%), its boundary cells (covered in part), coverage-weighted (Stage
0's phase A readout), and the whole frame. Then one interior cell at a time: a linear and an MLP
readout (the projector's own form: LayerNorm, Linear, GELU, Linear) of the object's shape from
the cell's token alone, by the cell's ring (its distance in cells from the nearest cell that is
not interior), and a frame's vote over its interior cells.

    python scripts/studies/shape_cells_tiny.py [--model tiny] [--train 1200] [--test 400] \
        [--out studies/results/stage0/shape_cells.json]

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
    from vr_tiny.pretrain import object_coverage
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


def fit(xtr, ytr, hidden: int = 0, steps: int = 1500, batch: int = 0):
    """A classifier fitted on standardised ``xtr``: logistic regression (``hidden`` 0) or an MLP
    of the projector's form; ``batch`` > 0 draws minibatches. Returns x -> logits."""
    torch.manual_seed(0)
    mu, sd = xtr.mean(0), xtr.std(0) + 1e-6
    n_out, d = int(ytr.max()) + 1, xtr.shape[1]
    net = torch.nn.Linear(d, n_out) if not hidden else torch.nn.Sequential(
        torch.nn.LayerNorm(d), torch.nn.Linear(d, hidden), torch.nn.GELU(),
        torch.nn.Linear(hidden, n_out))
    opt = torch.optim.Adam(net.parameters(), 1e-2 if not hidden else 2e-3, weight_decay=1e-4)
    xs = (xtr - mu) / sd
    for _ in range(steps):
        idx = torch.randint(len(xs), (batch,)) if batch else slice(None)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(xs[idx]), ytr[idx]).backward()
        opt.step()
    return lambda x: net((x - mu) / sd).detach()


def readout(xtr, ytr, xte, yte, steps: int = 1500) -> float:
    """Held-out accuracy of a logistic regression on standardised features."""
    net = fit(xtr, ytr, steps=steps)
    with torch.no_grad():
        return float((net(xte).argmax(-1) == yte).float().mean())


def rings(interior: torch.Tensor, grid=(16, 16)) -> torch.Tensor:
    """Per cell of a [H*W] interior mask: 0 outside it, else its distance in cells (king's
    moves) from the nearest cell outside it (the grid's edge counts as outside)."""
    m = interior.view(1, 1, *grid).float()
    out, k = torch.zeros_like(m), 0
    while m.any():
        k += 1
        out[m > 0] = k
        m = -torch.nn.functional.max_pool2d(-torch.nn.functional.pad(m, (1, 1, 1, 1)), 3, 1)
    return out.view(-1)


def cells(specs, Z):
    """Every interior cell's token [N, D], its object's shape [N], ring [N] and frame [N]."""
    from vr_tiny.pretrain import object_coverage
    xs, ys, rs, fs = [], [], [], []
    for f, (z, s) in enumerate(zip(Z, specs)):
        cov, _, shape = object_coverage(s)[0]
        ring = rings(cov >= 0.99)
        keep = ring > 0
        xs.append(z[keep])
        rs.append(ring[keep].long())
        ys += [shape] * int(keep.sum())
        fs += [f] * int(keep.sum())
    return torch.cat(xs), torch.tensor(ys), torch.cat(rs), torch.tensor(fs)


@torch.no_grad()
def cell_readouts(tr, te, Ztr, Zte, steps: int = 1500) -> dict:
    """Held-out shape accuracy from one interior cell's token: per cell, per ring (1, 2, 3+)
    and a frame's vote (summed log-probabilities over its interior cells); linear and MLP."""
    xtr, ytr, _, _ = cells(tr, Ztr)
    xte, yte, rte, fte = cells(te, Zte)
    out = {"cells": {"train": len(ytr), "test": len(yte)}}
    for name, hidden in (("linear", 0), ("mlp", 256)):
        with torch.enable_grad():
            net = fit(xtr, ytr, hidden, steps, batch=2048)
        logp = torch.log_softmax(net(xte), -1)
        right = (logp.argmax(-1) == yte).float()
        res = {"cell": round(float(right.mean()), 3)}
        for lo, hi, key in ((1, 1, "ring_1"), (2, 2, "ring_2"), (3, 99, "ring_3_plus")):
            sel = (rte >= lo) & (rte <= hi)
            res[key] = round(float(right[sel].mean()), 3) if sel.any() else None
        votes = torch.zeros(len(te), logp.shape[1]).index_add_(0, fte, logp)
        has = torch.bincount(fte, minlength=len(te)) > 0
        frame_y = torch.tensor([0] * len(te)).index_put_((fte,), yte)
        res["frame_vote"] = round(float((votes.argmax(-1) == frame_y)[has].float().mean()), 3)
        out[name] = res
    return out


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
    from vr_tiny.pretrain import frame_features
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
    with torch.no_grad():
        ptr, pte = bb.project(vtr), bb.project(vte)
    res["interior_cell"] = {"what": "held-out shape accuracy from one interior cell's token"}
    for name, (ztr, zte) in (("projected", (ptr, pte)), ("tower", (vtr, vte))):
        res["interior_cell"][name] = cell_readouts(tr, te, ztr, zte)
        print("interior_cell", name, json.dumps(res["interior_cell"][name]), flush=True)
    if a.out:
        from vr_runtime.data.atomic import write_atomic
        write_atomic(a.out, json.dumps(res, indent=2))   # whole or not at all, even if killed


if __name__ == "__main__":
    main()
