"""Can a trained vision tower put an object's shape into its interior cells? The tiny preset's
tower is frozen at its random fill, and there one interior cell's token says nothing of its
object's shape, before or after the projector (``shape_cells_tiny.py``: a frame's vote over its
interior cells is at chance, linear or MLP), so no projector can bind a color-gated read to a
shape. Here Stage 0's phase T trains the tower and the projector together on one objective per
cell (``CellReadout``: every cell an object covers at least half names that object's color and
shape through one linear readout, Stage 0's frames), then phase A trains the projector alone on
the same objective over a bank the trained tower encoded. Then fresh probes (not the trained
readout) measure what ``shape_cells_tiny.py`` measures, on its held-out one-object frames.

    python scripts/studies/tower_cells_tiny.py [--steps 2000] [--batch 16] \
        [--projector-steps 3000] [--frames 3000] [--out studies/results/stage0/tower_cells.json]

Nothing here is shipped: the weights it trains are dropped when it ends.
"""
import argparse
import json
import os
import random
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shape_cells_tiny as cells_study  # noqa: E402  (a sibling study script, not a package)


def train(bb, a, log_path: str):
    """Phase T (``tower_steps``), then phase A with the per-cell readout on a bank of
    ``a.frames`` frames encoded by the trained tower (``projector_steps``): Stage 0's own
    functions with these settings. Returns {phase: seconds}."""
    from vr_tiny.pretrain import (PretrainConfig, pretrain_projector, pretrain_tower,
                                              render_bank)
    cfg = PretrainConfig.load("tiny_stage0", tower_steps=a.steps, tower_batch_size=a.batch,
                              tower_learning_rate=a.tower_lr, projector_readout="cells",
                              projector_steps=a.projector_steps, frames=a.frames, seed=a.seed,
                              log_every=25)
    times = {}
    with open(log_path, "w") as log:
        t = time.time()
        pretrain_tower(bb, cfg, random.Random(f"stage0-tower-{cfg.seed}"), log, True)
        times["tower_s"] = round(time.time() - t, 1)
        if cfg.projector_steps:
            t = time.time()
            V, specs = render_bank(cfg.frames, cfg, cfg.seed, bb)
            pretrain_projector(bb, V, specs, cfg, random.Random(f"stage0-proj-{cfg.seed}"), log,
                               True)
            times["projector_s"] = round(time.time() - t, 1)
    for p in bb.model.parameters():
        p.requires_grad_(False)
    return times


@torch.no_grad()
def probes(bb, n_train: int, n_test: int) -> dict:
    """``shape_cells_tiny``'s readouts (means and single interior cells) with fresh probes."""
    from vr_tiny.pretrain import frame_features
    tr, te = cells_study.frames(n_train, 0), cells_study.frames(n_test, 1)
    vtr, vte = frame_features(bb, tr).float(), frame_features(bb, te).float()
    ptr, pte = bb.project(vtr), bb.project(vte)
    out = {}
    for name, (ztr, zte) in (("projected", (ptr, pte)), ("tower", (vtr, vte))):
        (xtr, ytr), (xte, yte) = (cells_study.means(bb, tr, ztr, False),
                                  cells_study.means(bb, te, zte, False))
        with torch.enable_grad():
            out[name] = {"means": {k: round(cells_study.readout(xtr[k], ytr, xte[k], yte), 3)
                                   for k in xtr},
                         "interior_cell": cells_study.cell_readouts(tr, te, ztr, zte)}
        print(name, json.dumps(out[name]), flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tower-lr", type=float, default=5e-4)
    ap.add_argument("--projector-steps", type=int, default=3000, help="phase A, cells readout")
    ap.add_argument("--frames", type=int, default=3000, help="phase A's bank")
    ap.add_argument("--train", type=int, default=1200, help="probe frames (fit)")
    ap.add_argument("--test", type=int, default=400, help="probe frames (held out)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--save", default=None, help="write the trained tower and projector here")
    a = ap.parse_args(argv)
    if a.steps < 1 or a.batch < 1 or a.train < 30 or a.test < 30:
        sys.exit(f"--steps/--batch: expected >= 1, --train/--test >= 30; got {a.steps}/"
                 f"{a.batch}/{a.train}/{a.test}")
    from vr_runtime.backbones import load_backbone
    bb = load_backbone(a.model)
    with tempfile.TemporaryDirectory() as tmp:   # the log goes into the results file
        log_path = os.path.join(tmp, "log.jsonl")
        times = train(bb, a, log_path)
        log = [json.loads(x) for x in open(log_path)]
    if a.save:
        torch.save({k: v for k, v in bb.model.state_dict().items()
                    if k.startswith(("model.vision_tower", "model.multi_modal_projector"))},
                   a.save)
    res = {"what": "the tiny tower and projector trained on a per-cell color and shape readout, "
                   "then shape_cells_tiny's held-out probes on fresh frames",
           "command": "python " + " ".join(sys.argv), "model": a.model,
           "settings": {k: v for k, v in vars(a).items() if k != "out"},
           **times, "log": log,
           "after": probes(bb, a.train, a.test)}
    if a.out:
        from vr_runtime.data.atomic import write_atomic
        write_atomic(a.out, json.dumps(res, indent=2))   # whole or not at all, even if killed


if __name__ == "__main__":
    main()
