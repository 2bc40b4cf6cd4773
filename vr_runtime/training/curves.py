"""Training curves of the three stages as one PNG (from each stage's ``log.jsonl``)."""
from __future__ import annotations

import json
import os

PANELS = ((1, "Stage 1: Image Router", ("l_img",), "frame_acc"),
          (2, "Stage 2: Semantic Router", ("l_sem",), "policy_acc"),
          (3, "Stage 3: joint fine-tuning", ("loss", "l_lm", "l_sem", "l_img"), None))


def read_log(path: str):
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_curves(runs_dir: str, out: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, (stage, title, keys, acc_key) in zip(axes, PANELS):
        log = read_log(os.path.join(runs_dir, f"stage{stage}", "log.jsonl"))
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
        if not log:
            ax.text(0.5, 0.5, "no log", ha="center", transform=ax.transAxes)
            continue
        steps = [r["step"] for r in log]
        for k in keys:
            if k in log[0]:
                ax.plot(steps, [r[k] for r in log], label=k)
        if stage == 3:  # Stage 3b continues Stage 3 (inference-matched plans): steps run on
            more = read_log(os.path.join(runs_dir, "stage3b", "log.jsonl"))
            if more:
                ax.axvline(steps[-1], color="gray", ls=":", lw=1)
                s3b = [steps[-1] + r["step"] for r in more]
                for k in keys:
                    if k in more[0]:
                        ax.plot(s3b, [r[k] for r in more], label=f"{k} (3b)")
        ax.set_ylabel("loss")
        ax.set_yscale("log")
        if acc_key and acc_key in log[0]:
            ax2 = ax.twinx()
            ax2.plot(steps, [r[acc_key] for r in log], "g--", label=f"{acc_key} (train batch)")
            ax2.set_ylim(0, 1.02)
            ax2.set_ylabel("accuracy")
            ax2.legend(loc="center right", fontsize=8)
        # Stage 3 has eight curves (3 + 3b): two columns at the bottom keep them all visible.
        ax.legend(loc="lower left" if stage == 3 else "upper right", fontsize=7,
                  ncol=2 if stage == 3 else 1)
    fig.suptitle("VideoRouter tiny preset on the synthetic evidence task (CPU)")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
