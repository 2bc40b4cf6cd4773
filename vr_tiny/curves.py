"""Training curves of the three stages as one PNG (from each stage's ``log.jsonl``; Stage 3's
panel also draws its continuations 3b to 3g)."""
from __future__ import annotations

import json
import os

PANELS = ((1, "Stage 1: Image Router", ("l_img",), "frame_acc"),
          (2, "Stage 2: Semantic Router", ("l_sem",), "policy_acc"),
          (3, "Stage 3: joint fine-tuning",
           ("loss", "l_lm", "l_sem", "l_img", "l_route", "l_evidence", "l_exclusion"), None))


def read_log(path: str):
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _stage3_segments(ax, runs_dir: str, keys) -> list:
    """Stage 3 and its continuations, one after the other on one step axis (3b: the plans of
    inference; 3c: the dense and long layouts; 3d: route supervision; 3e and 3f: the same on
    every training video; 3g: on three times the videos), a dotted line where each starts. A
    run that began at 3c, 3d, 3e or 3g (``--from-v2``, ``--from-v3``, ``--from-v5``) shows what
    it ran.
    Returns every record drawn."""
    drawn, offset = [], 0
    for name, tag in (("stage3", ""), ("stage3b", " (3b)"), ("stage3c", " (3c)"),
                      ("stage3d", " (3d)"), ("stage3e", " (3e)"), ("stage3f", " (3f)"),
                      ("stage3g", " (3g)")):
        log = read_log(os.path.join(runs_dir, name, "log.jsonl"))
        if not log:
            continue
        if drawn:
            ax.axvline(offset, color="gray", ls=":", lw=1)
        steps = [offset + r["step"] for r in log]
        for k in keys:
            if k in log[0]:
                ax.plot(steps, [r[k] for r in log], label=f"{k}{tag}")
        drawn += log
        offset = steps[-1]
    return drawn


def plot_curves(runs_dir: str, out: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, (stage, title, keys, acc_key) in zip(axes, PANELS):
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
        log = read_log(os.path.join(runs_dir, f"stage{stage}", "log.jsonl"))
        if stage == 3:
            log = _stage3_segments(ax, runs_dir, keys)
        elif log:
            steps = [r["step"] for r in log]
            for k in keys:
                if k in log[0]:
                    ax.plot(steps, [r[k] for r in log], label=k)
        if not log:
            ax.text(0.5, 0.5, "not in this run", ha="center", transform=ax.transAxes)
            continue
        ax.set_ylabel("loss")
        ax.set_yscale("log")
        if acc_key and acc_key in log[0]:
            ax2 = ax.twinx()
            ax2.plot([r["step"] for r in log], [r[acc_key] for r in log], "g--",
                     label=f"{acc_key} (train batch)")
            ax2.set_ylim(0, 1.02)
            ax2.set_ylabel("accuracy")
            ax2.legend(loc="center right", fontsize=8)
        # Stage 3 has up to twelve curves (3, 3b, 3c): two columns at the bottom.
        ax.legend(loc="lower left" if stage == 3 else "upper right", fontsize=7,
                  ncol=2 if stage == 3 else 1)
    fig.suptitle("VideoRouter tiny preset on the synthetic evidence task (CPU)")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
