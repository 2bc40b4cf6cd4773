"""Fine-tuning steps at a real shape: the paper's Stage 3 (and the routers' Stages 1-2) with the
fused pool_pack kernels against the plain PyTorch reference, in one loop.

Each step is the training loop's own (``vr_runtime.training.loop.build``: the stage's freezing,
``Trainee``, AdamW): ``batch`` examples of ``frames`` frames of pre-projector features (what the
feature cache holds: the frozen tower is not in the step), a question and an answer, planned
from the labels (``relevant`` frames at full resolution, the rest 4x4), then forward, backward
and the optimizer step. Only ``pool_pack_backend`` differs between the rows of one shape:

  kernel      ``auto``: the Triton kernels on CUDA (the vectorised PyTorch path on CPU)
  reference   ``vr_kernels.reference``: one ``avg_pool2d`` per frame, then a scatter

Reported per row: step time (median of ``--steps`` after ``--warmup``), visual and text tokens a
second (the packed prompt's rows per step over its time), peak memory of the step (CUDA: the
allocator's peak; CPU: not measured), and the first step's loss, which must be the same for both
backends (same seed, same data): the fused path computes the same function.

Shapes (random weights, ``vr_runtime/configs/internvl3_*.json``; what is trained is stated in the
results):
  2b   InternVL3-2B, Stage 3 as the paper: projector, LLM and routers trained, tower frozen
  8b   InternVL3-8B, Stage 3 on one 141 GB GPU: tower and LLM frozen but its last
       ``--train-layers`` layers (AdamW states of the whole 8B LLM do not fit beside it),
       projector and routers trained; gradient checkpointing as the paper's config
  tiny the CPU dry run (tests/bench/test_bench_train.py)

Usage (GPU)::

    python -m bench.scripts.bench_train --shape 2b --out $OUT/train_gpu_2b.json
    python -m bench.scripts.bench_train --shape 8b --stages 3,1,2 \\
        --out $OUT/train_gpu_8b.json

CPU dry run::

    python -m bench.scripts.bench_train --cpu --shape tiny --frames 6 --steps 1 --warmup 0
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time
from typing import List

import torch

from bench.harness.env import environment
from bench.harness.results import report
from bench.harness.tables import markdown_table

ROOT = pathlib.Path(__file__).resolve().parents[2]

CONFIGS = ROOT / "vr_runtime" / "configs"
BACKENDS = {"kernel": "auto", "reference": "reference"}
QUESTION = "What colour is the car that enters the parking lot after the truck leaves?"
ANSWER = "The car is red, and it parks next to the white van."


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default=None, help="tiny, 2b or 8b (default: 2b on CUDA, tiny "
                    "on CPU)")
    ap.add_argument("--stages", default="3", help="comma list of 1, 2, 3 (default: 3)")
    ap.add_argument("--backends", default="kernel,reference",
                    help="comma list of kernel, reference (default: both)")
    ap.add_argument("--frames", type=int, default=64, help="frames an example (default 64)")
    ap.add_argument("--relevant", type=int, default=None,
                    help="frames at full resolution (default: 7/16 of --frames, 28 of 64)")
    ap.add_argument("--batch", type=int, default=1, help="examples a step (default 1)")
    ap.add_argument("--train-layers", type=int, default=4,
                    help="8b: the LLM's last N layers trained (default 4)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--out", default=None, help="results JSON (a .md beside it)")
    a = ap.parse_args(argv)
    a.cpu = a.cpu or not torch.cuda.is_available()
    a.shape = a.shape or ("tiny" if a.cpu else "2b")
    if a.shape not in ("tiny", "2b", "8b"):
        ap.error(f"--shape: expected tiny, 2b or 8b, got {a.shape!r}")
    try:
        a.stages = [int(s) for s in a.stages.split(",")]
    except ValueError:
        ap.error(f"--stages: expected a comma list of 1, 2, 3, got {a.stages!r}")
    if not set(a.stages) <= {1, 2, 3}:
        ap.error(f"--stages: expected a comma list of 1, 2, 3, got {a.stages}")
    a.backends = a.backends.split(",")
    if not set(a.backends) <= set(BACKENDS):
        ap.error(f"--backends: expected a comma list of {', '.join(BACKENDS)}")
    for name in ("frames", "batch", "steps", "train_layers"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: expected an int >= 1")
    if a.warmup < 0:
        ap.error("--warmup: expected an int >= 0")
    a.relevant = a.frames * 7 // 16 if a.relevant is None else a.relevant
    if not 0 <= a.relevant <= a.frames:
        ap.error(f"--relevant: expected 0..{a.frames}, got {a.relevant}")
    return a


def backbone(shape: str, device, dtype):
    from vr_runtime.backbones import backbone_from_config, load_backbone
    if shape == "tiny":
        return load_backbone("tiny", device=device, dtype=dtype)
    cfg = json.loads((CONFIGS / f"internvl3_{shape}.json").read_text())
    return backbone_from_config(cfg, device=device, dtype=dtype, seed=0)


def stage_config(args, stage: int, backend: str):
    """The paper's stage config (``train_stage{1,2,3}.json``) with the benchmark's settings."""
    from vr_runtime.training.config import load_config
    over = dict(model="tiny", routers=None, train_data="unused.jsonl", eval_data=None,
                output_dir="unused", pool_pack_backend=BACKENDS[backend],
                per_device_train_batch_size=args.batch, plan_from="labels",
                frames_per_example=0)
    if stage == 3 and args.shape == "8b":
        over["freeze_language_model"] = False   # then all but the last layers frozen below
    return load_config(f"stage{stage}", **over)


def examples(lm, args, device) -> List[dict]:
    """``batch`` examples: pre-projector features of ``frames`` frames, the question's ids,
    frame labels (the first ``relevant`` of every 16 frames spread evenly) and a policy."""
    g = torch.Generator().manual_seed(0)
    proj = lm.projector()
    width = next(m for m in proj.modules() if isinstance(m, torch.nn.Linear)).in_features
    H, W = lm.grid
    q_ids = lm.tokenizer(QUESTION, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    labels = torch.zeros(args.frames)
    labels[torch.linspace(0, args.frames - 1, args.relevant).round().long()] = 1.0
    return [dict(v=torch.randn(args.frames, H * W, width, generator=g).to(device, lm.dtype),
                 q_ids=q_ids.to(device), labels=labels.clone(), policy=1, question=QUESTION,
                 answer=ANSWER, times=None) for _ in range(args.batch)]


def trainee_for(args, lm, stage: int, backend: str):
    """The training loop's model, routers and Trainee for the stage, and the optimizer over
    what it trains (8b Stage 3: the LLM's last ``train_layers`` layers of the language group)."""
    from vr_runtime.training.loop import _optimizer, build
    cfg = stage_config(args, stage, backend)
    _, routers, trainee, params = build(cfg, lm=lm)
    routers.to_model(lm.device, lm.dtype)
    if stage == 3 and args.shape == "8b":
        keep = {id(p) for layer in lm.decoder().layers[-args.train_layers:]
                for p in layer.parameters()}
        keep |= {id(p) for m in (lm.projector(), routers) for p in m.parameters()}
        for p in params:
            if id(p) not in keep:
                p.requires_grad_(False)
        params = [p for p in params if id(p) in keep]
    if stage == 3 and cfg.gradient_checkpointing:
        lm.decoder().gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False})
        lm.decoder().train()
    return trainee, _optimizer(params, cfg), sum(p.numel() for p in params)


def packed_tokens(lm, args) -> int:
    """Visual rows of one example's prompt under the labels' plan (s1 = 1, s0 = 4)."""
    from vr_kernels import pooled_counts
    per = {w: pooled_counts([w], lm.grid)[0] for w in (1, 4)}
    return args.relevant * per[1] + (args.frames - args.relevant) * per[4]


def run_row(args, lm, stage, backend, device) -> dict:
    torch.manual_seed(0)
    trainee, opt, n_params = trainee_for(args, lm, stage, backend)
    # the steps change the shared model: its trained weights go back after the row, so that
    # every row starts from the same weights (and the first losses compare)
    saved = {n: p.detach().to("cpu", copy=True) for n, p in lm.model.named_parameters()
             if p.requires_grad}
    batch = examples(lm, args, device)
    losses = []

    def step():
        out = trainee(batch)
        out["loss"].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(out["loss"].detach()))

    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    times = []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    visual = packed_tokens(lm, args) * args.batch if stage == 3 else 0
    row = dict(stage=stage, backend=backend, trained_params=n_params, step_s=round(t, 6),
               steps_s=[round(x, 6) for x in times], first_loss=losses[0],
               visual_tokens_per_step=visual,
               visual_tokens_per_s=round(visual / t, 1) if visual else None)
    if device.type == "cuda":
        row["peak_step_gb"] = round((torch.cuda.max_memory_allocated() - base) / 1e9, 3)
        row["peak_total_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 3)
    del trainee, opt
    if stage == 3:
        lm.decoder().gradient_checkpointing_disable()
    with torch.no_grad():
        for n, p in lm.model.named_parameters():   # the next row starts from a clean model
            p.grad = None
            if n in saved:
                p.copy_(saved[n])
    return row


def main(argv=None) -> int:
    args = parse(argv)
    import warnings   # transformers' renaming notices (gradient checkpointing), once a row
    warnings.filterwarnings("ignore", category=FutureWarning)
    device = torch.device("cpu" if args.cpu else "cuda")
    dtype = torch.float32 if args.cpu else torch.bfloat16
    lm = backbone(args.shape, device, dtype)
    rows = []
    for stage in args.stages:
        for backend in (args.backends if stage == 3 else args.backends[:1]):  # no pool in 1-2
            try:
                row = run_row(args, lm, stage, backend, device)
            except (RuntimeError, ValueError) as e:   # OOM: keep the other rows
                row = dict(stage=stage, backend=backend,
                           error=f"{type(e).__name__}: {e}".splitlines()[0][:300])
            rows.append(row)
            print(json.dumps({k: row.get(k) for k in ("stage", "backend", "step_s",
                                                       "visual_tokens_per_s", "peak_step_gb",
                                                       "first_loss", "error")}), flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    same = [r["first_loss"] for r in rows if r.get("stage") == 3 and "first_loss" in r]
    env = environment(device)
    label = "CPU dry run (not a performance figure)" if args.cpu else "GPU figures"
    trained = {"tiny": "the stage's config", "2b": "Stage 3 as the paper (tower frozen)",
               "8b": f"tower and LLM frozen but its last {args.train_layers} layers; projector "
                     f"and routers trained"}[args.shape]
    settings = dict(shape=args.shape, dtype=str(dtype).replace("torch.", ""),
                    frames=args.frames, relevant=args.relevant, batch=args.batch,
                    steps=args.steps, warmup=args.warmup, trained=trained)
    body = [markdown_table(rows, ["stage", "backend", "step_s", "visual_tokens_per_s",
                                         "peak_step_gb", "trained_params", "first_loss", "error"],
                                  ["Stage", "pool_pack", "Step s", "Visual tokens/s",
                                   "Peak GB (step)", "Trained params", "First loss", "Error"])]
    out = args.out or str(ROOT / "bench" / "results" /
                          f"train_{'cpu' if args.cpu else 'gpu'}_{args.shape}.json")
    notes = [f"{args.shape} shape, {settings['dtype']}, {args.frames} frames ({args.relevant} "
             f"at full resolution, the rest 4x4), batch {args.batch}; trained: {trained}"]
    report(out, f"### Fine-tuning steps: fused pool_pack vs reference ({env['device']})",
                  env, notes, body, label=label, settings=settings, rows=rows)
    losses_agree = len(same) < 2 or max(same) - min(same) <= 1e-3 * max(1.0, abs(same[0]))
    return 0 if losses_agree and not any(r.get("error") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
