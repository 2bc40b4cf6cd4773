"""Decoding speed after the prefill, per decoding mode (the GPU table's row "decoding, wall time
per new token"; vr_runtime.generate).

For each mode (dynamic cache / static cache / static cache compiled by inductor / the same
plus CUDA graphs) and batch size, the same prompt of ``--prompt-tokens`` rows (random token
embeddings: the decode cost does not depend on what the rows hold) is prefilled and
``--new-tokens`` greedy tokens are decoded with no stop id, ``--runs`` times after ``--warmup``
untimed calls. The compiled modes are first compiled as the runtime does at load
(``GreedyDecoder.warm_up`` for one cache that every run fits): ``compile_s``. Run twice with one
``--compile-cache`` directory, the first process measures the cold compile and the second the
warm start from the caches on disk. Reported per row:

  ms_per_token         the "generate" stage / (new tokens - 1): every decode step, plus the copy
                       of the prefill's keys and values into the static cache (static modes)
  ms_per_token_marginal (t(2N) - t(N)) / N from runs of N and 2N tokens: one step, nothing else
  tokens_equal_dynamic the greedy tokens are those of the dynamic (original) path (required at
                       fp32; at bf16 fused kernels may round a near-tie the other way)
  compile_s            the load-time compile (and capture) of the step, compiled modes

Usage (GPU, the InternVL3-8B shape, bf16)::

    python -m bench.scripts.bench_decode --out $OUT/decode_gpu_8b.json

CPU smoke (tiny preset)::

    python -m bench.scripts.bench_decode --cpu --shape tiny --prompt-tokens 200 --new-tokens 8 --runs 1
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
from bench.harness.results import finish
from bench.harness.tables import markdown_table

ROOT = pathlib.Path(__file__).resolve().parents[2]

CONFIGS = ROOT / "vr_runtime" / "configs"
GOAL_MS = 7.0   # the goal: <= 7 ms a token at the 8B shape on an H100


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default=None, help="tiny, 1b, 2b or 8b (default: 8b on CUDA, "
                    "tiny on CPU)")
    ap.add_argument("--modes", default=None, help="comma list of dynamic,static,compiled,graph "
                    "(default: all that run on the device)")
    ap.add_argument("--compile-cache", default=None, metavar="DIR",
                    help="torch.compile's caches in DIR (vr_runtime.generate.use_compile_cache): "
                         "a second run with the same DIR measures the warm start")
    ap.add_argument("--batch-sizes", default="1,4")
    ap.add_argument("--prompt-tokens", type=int, default=8255,
                    help="prompt rows (default 8,255: VideoRouter (s=2,4) at 64 frames)")
    ap.add_argument("--new-tokens", type=int, default=33)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default=None)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--out", default=None, help="results JSON (a .md beside it)")
    a = ap.parse_args(argv)
    a.cpu = a.cpu or not torch.cuda.is_available()
    a.shape = a.shape or ("tiny" if a.cpu else "8b")
    if a.shape not in ("tiny", "1b", "2b", "8b"):
        ap.error(f"--shape: expected tiny, 1b, 2b or 8b, got {a.shape!r}")
    cuda_modes = ["dynamic", "static", "compiled", "graph"]
    a.modes = a.modes.split(",") if a.modes else (["dynamic", "static"] if a.cpu else cuda_modes)
    for m in a.modes:
        if m not in cuda_modes:
            ap.error(f"--modes: {m!r} is not one of {','.join(cuda_modes)}")
        if m == "graph" and a.cpu:
            ap.error("--modes: graph (CUDA graphs) needs CUDA")
    try:
        a.batch_sizes = [int(x) for x in a.batch_sizes.split(",")]
    except ValueError:
        ap.error(f"--batch-sizes: expected a comma list of ints, got {a.batch_sizes!r}")
    for name in ("prompt_tokens", "runs"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: expected an int >= 1")
    if a.new_tokens < 2 or a.warmup < 0 or min(a.batch_sizes) < 1:
        ap.error("--new-tokens >= 2, --warmup >= 0 and batch sizes >= 1, please")
    return a


def build_backbone(args, device, dtype):
    from vr_runtime.backbones import backbone_from_config, load_backbone
    if args.shape == "tiny":
        return load_backbone("tiny", device=device, dtype=dtype)
    cfg = json.loads((CONFIGS / f"internvl3_{args.shape}.json").read_text())
    return backbone_from_config(cfg, device=device, dtype=dtype, seed=0)


def decoder_for(lm, mode: str, slots: int):
    """The decoder, its step compiled (compiled modes) for one cache of ``slots`` as the
    runtime does at load -> (decoder, seconds the compile took)."""
    from vr_runtime.generate import GreedyDecoder
    dec = GreedyDecoder(lm, mode)
    return dec, dec.warm_up(slots)["seconds"]


def timed(dec, prompts, n: int, device) -> tuple:
    from vr_runtime.telemetry.timing import StageTimer
    timer = StageTimer(device)
    gens = dec.generate(prompts, [n] * len(prompts), [None] * len(prompts), set(), timer)
    return timer.get("generate"), gens


def measure(args, lm, device) -> List[dict]:
    g = torch.Generator().manual_seed(0)
    rows, reference = [], {}
    V = lm.model.get_input_embeddings().num_embeddings
    for B in args.batch_sizes:
        # different lengths per request (answer_batch pads to the longest)
        prompts = []
        for b in range(B):
            ids = torch.randint(0, V, (1, args.prompt_tokens - 7 * b), generator=g).to(device)
            with torch.inference_mode():
                prompts.append(lm.embed_tokens(ids))
        for mode in args.modes:
            row = dict(mode=mode, batch=B, prompt_tokens=args.prompt_tokens,
                       new_tokens=args.new_tokens)
            try:
                dec, row["compile_s"] = decoder_for(lm, mode,
                                                    args.prompt_tokens + 2 * args.new_tokens)
                t0 = time.perf_counter()
                for _ in range(args.warmup):
                    timed(dec, prompts, args.new_tokens, device)
                    timed(dec, prompts, 2 * args.new_tokens, device)
                row["warmup_s"] = round(time.perf_counter() - t0, 3)
                short, long_ = [], []
                for _ in range(args.runs):
                    t, gens = timed(dec, prompts, args.new_tokens, device)
                    short.append(t)
                    long_.append(timed(dec, prompts, 2 * args.new_tokens, device)[0])
                ts, tl = statistics.median(short), statistics.median(long_)
                row.update(
                    generate_s=ts, ms_per_token=1e3 * ts / (args.new_tokens - 1),
                    ms_per_token_marginal=1e3 * (tl - ts) / args.new_tokens,
                    runs_generate_s=short)
                if mode == "dynamic":
                    reference[B] = gens
                row["tokens_equal_dynamic"] = (gens == reference[B]) if B in reference else None
                dec.release()
            except (RuntimeError, ValueError) as e:   # OOM, a compile failure: keep the others
                row["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            rows.append(row)
            print(json.dumps({k: row.get(k) for k in ("mode", "batch", "ms_per_token",
                                                       "ms_per_token_marginal",
                                                       "tokens_equal_dynamic", "error")}),
                  flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    args = parse(argv)
    if args.compile_cache:
        from vr_runtime.generate import use_compile_cache
        use_compile_cache(args.compile_cache)
    device = torch.device("cpu" if args.cpu else "cuda")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}.get(
        args.dtype, torch.float32 if args.cpu else torch.bfloat16)
    lm = build_backbone(args, device, dtype)
    rows = measure(args, lm, device)
    env = environment(device)
    label = ("CPU figures (not comparable with the paper's GPU)" if args.cpu else "GPU figures")
    doc = dict(benchmark="decode (vr_runtime.generate modes)", label=label, environment=env,
               settings=dict(shape=args.shape, dtype=str(dtype).replace("torch.", ""),
                             prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens,
                             runs=args.runs, warmup=args.warmup,
                             goal_ms_per_token=None if args.cpu else GOAL_MS),
               rows=rows)
    out = args.out or str(ROOT / "bench" / "results" / f"decode_{'cpu' if args.cpu else 'gpu'}_"
                                            f"{args.shape}.json")
    md = (f"### Decoding per token: {env['device']} | {args.shape} shape, "
          f"{doc['settings']['dtype']}, prompt {args.prompt_tokens:,} tokens\n\n*{label}.* "
          f"`{env['command']}`; torch {env['torch']}, transformers {env['transformers']}; "
          f"{env['date_utc']}.\n\n"
          + markdown_table(rows, ["mode", "batch", "ms_per_token",
                                         "ms_per_token_marginal", "tokens_equal_dynamic",
                                         "compile_s", "warmup_s", "error"],
                                  ["Mode", "Batch", "ms/token", "ms/token (marginal)",
                                   "Tokens = dynamic", "Compile s", "Warm-up s", "Error"]))
    finish(out, doc, md, show=False)
    exact = dtype == torch.float32   # the tokens must match there; bf16 reports them
    return 0 if not any(r.get("error") or (exact and r.get("tokens_equal_dynamic") is False)
                        for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
