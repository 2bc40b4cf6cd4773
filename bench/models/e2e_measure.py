"""How bench/scripts/bench_e2e.py measures a row: one device's synchronisation and memory
readers, the answer options of each row at the fixed budget, warm-up then timed calls, the
median over runs, and the batch rows (several videos a pass)."""
from __future__ import annotations

import ctypes
import statistics
import time
from typing import List, Optional

import torch

from bench.models import e2e_memory
from bench.models.e2e_model import clip_scorer, random_video, relevance_pattern, routers_trained


class Device:
    """Synchronisation, allocator resets and memory readers for one device."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.nvml, self.nvml_scope = e2e_memory.nvml_reader(device.index or 0)
        else:
            self.nvml, self.nvml_scope = None, "n/a (CPU)"
        self.rss = None if self.cuda else e2e_memory.rss_reader()
        self._libc = None
        if not self.cuda:
            try:
                self._libc = ctypes.CDLL("libc.so.6")
            except OSError:
                self._libc = None

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def release(self):
        """Between rows: hand cached/freed memory back so the next row's peak is its own."""
        import gc
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()
        elif self._libc is not None and hasattr(self._libc, "malloc_trim"):
            self._libc.malloc_trim(0)

    def sampler(self) -> e2e_memory.PeakSampler:
        # Within one call the caching allocator only grows its reserve (nothing calls
        # empty_cache), so NVML's reading is non-decreasing and a 10 ms poll loses nothing while
        # keeping the sampler thread off the launch path. Freed CPU buffers do go back to the OS
        # (large blocks are mmapped), so RSS is polled faster.
        if self.cuda:
            return e2e_memory.PeakSampler(self.nvml, interval_s=0.010)
        return e2e_memory.PeakSampler(self.rss, interval_s=0.002)

    def reset_peak(self):
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def torch_peak(self) -> Optional[int]:
        return torch.cuda.max_memory_allocated(self.device) if self.cuda else None


def needs_relevance(kw: dict) -> bool:
    """Whether a row's planner reads frame relevance: asked of its registration
    (vr_runtime.planning.policies), so a new relevance planner gets the relevance rows' treatment."""
    from vr_runtime.planning.policies import get_planner
    return get_planner(kw["policy"]).needs_relevance


def budgeted(kw: dict) -> bool:
    """Whether a row's planner (or the ones auto routes to) plans under a visual budget."""
    from vr_runtime.planning.policies import is_budgeted
    return is_budgeted(kw["policy"])


def answer_options(args, num_frames: int, max_length: int, budget: int, kw: dict,
                   relevant=None):
    """The AnswerOptions of one row, at the fixed visual budget. VideoRouter rows run both
    routers: with a fixed ``relevant`` pattern through ``FixedRelevance(run_routers=True)``
    (decisions imposed, cost real), else policy "auto" as a trained deployment would."""
    from vr_runtime.request import AnswerOptions
    from vr_runtime.routing.scorers import FixedRelevance
    out = dict(num_frames=num_frames, max_length=max_length, max_new_tokens=args.max_new_tokens,
               margin=args.margin, **kw)
    if budgeted(kw):
        out["budget"] = budget
    if kw.get("scorer") == "clip":
        out["scorer"] = clip_scorer(args, args._vr, num_frames)
    elif needs_relevance(kw):
        if relevant is not None:
            # the pool goes to the scorer: answer(router_pool=) only reaches the default one
            out["scorer"] = FixedRelevance(relevant, run_routers=True,
                                           router_pool=args.router_pool)
        else:
            out["policy"] = "auto"
            if args.router_pool is not None:
                out["router_pool"] = args.router_pool
    return AnswerOptions(**out)


def answer(vr, video, args, max_length: int, budget: int, kw: dict, relevant):
    """One VideoRouter.answer call of a row."""
    return vr.answer(video, args.question, options=answer_options(
        args, int(video.shape[0]), max_length, budget, kw, relevant))


def call(vr, dev: Device, video, args, max_length: int, budget: int, kw: dict, relevant) -> dict:
    """One answer(); returns its report plus the harness's own measurements."""
    dev.reset_peak()
    with dev.sampler() as s:
        dev.sync()
        t0 = time.perf_counter()
        res = answer(vr, video, args, max_length, budget, kw, relevant)
        dev.sync()
        wall = time.perf_counter() - t0
    rep = dict(res.report)
    rep["_wall_s"] = wall
    rep["_outside_peak"] = s.peak
    tp = dev.torch_peak()
    # the report's peak is the CUDA allocator's there; on CPU it is the process's resident
    # high-water mark, which the harness measures apart (_outside_peak)
    rep["_torch_peak"] = (rep.get("peak_memory_bytes") or tp) if dev.cuda else None
    return rep


def used_router_pool(rows: List[dict]):
    """The Image Router window the rows' answers report (one value, a sorted list when rows
    differ, None when no row ran the Image Router)."""
    pools = sorted({r["router_pool"] for r in rows if r.get("router_pool") is not None})
    return pools[0] if len(pools) == 1 else (pools or None)


def _norm(w):
    """A window as JSON writes it (1, [1, 2]) or as the planner returns it (1, (1, 2)) -> tuple."""
    if isinstance(w, (list, tuple)):
        return tuple(int(x) for x in w)
    return (int(w), int(w)) if w else 0


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarise(reports: List[dict]) -> dict:
    """Median over runs of each stage (TTFT is the median of the per-run TTFTs, not a sum)."""
    t = lambda k: median([r.get("timings_s", {}).get(k) for r in reports])  # noqa: E731
    last = reports[-1]
    ttfts = [r.get("timings_s", {}).get("ttft") for r in reports]
    vision, compress = t("vision"), t("compress")
    vc = median([(r["timings_s"].get("vision") or 0) + (r["timings_s"].get("compress") or 0)
                 for r in reports])
    gb = lambda b: None if b is None else b / 1e9  # noqa: E731
    return dict(
        visual_tokens=last.get("visual_tokens"), dense_visual_tokens=last.get("dense_visual_tokens"),
        budget_runtime=last.get("budget"), text_tokens=last.get("text_tokens"),
        windows=last.get("windows"), policy_run=last.get("policy"),
        router_pool=last.get("router_pool"), generated_tokens=last.get("generated_tokens"),
        router_s=t("router"), vision_s=vision, compress_s=compress, vision_compress_s=vc,
        prefill_s=t("prefill"), ttft_s=t("ttft"), generate_s=t("generate"),
        # decode steps after the prefill's token; the first step of a run includes the copy
        # into the static cache (static/graph decoding)
        decode_ms_per_token=median([1e3 * r["timings_s"]["generate"] / (r["generated_tokens"] - 1)
                                    for r in reports if (r.get("generated_tokens") or 0) > 1
                                    and r.get("timings_s", {}).get("generate") is not None]),
        decoding=last.get("decoding"),
        total_s=median([r["_wall_s"] for r in reports]),
        ttft_min_s=min(x for x in ttfts if x is not None) if any(x is not None for x in ttfts) else None,
        ttft_max_s=max(x for x in ttfts if x is not None) if any(x is not None for x in ttfts) else None,
        runs=len(reports), runs_ttft_s=ttfts,
        peak_mem_gb=gb(max((r["_torch_peak"] or 0) for r in reports) or None),
        nvml_stage_peak_gb=gb(max((r.get("peak_memory_nvml_bytes") or 0) for r in reports) or None),
        outside_peak_gb=gb(max((r["_outside_peak"] or 0) for r in reports) or None),
        # the runtime's own: CUDA, the allocator's peak minus the weights on the device; CPU,
        # the resident set's rise over the request (vr_runtime.telemetry.memory)
        activation_peak_gb=gb(max((r.get("peak_activation_bytes") or 0) for r in reports) or None),
        weights_gb=gb((last.get("weights_bytes") or {}).get("total")),
        shadow_stack_gb=gb((last.get("weights_bytes") or {}).get("shadow_stack")),
    )


def measure_row(vr, dev, args, video, key, label, kw, *, sweep, budget, max_length, relevant):
    """Warm-up, then ``args.runs`` timed calls of one policy; a row dict (``error`` on failure)."""
    row = dict(sweep=sweep, policy=key, label=label, frames=int(video.shape[0]), budget=budget,
               batch=1, max_length=max_length)
    fragment = needs_relevance(kw)
    routed = fragment and kw.get("scorer") != "clip"     # the CLIP row does not use the routers
    rel = relevant if fragment else None
    if fragment:
        row["relevant"] = None if rel is None else sum(rel)
    if kw.get("scorer") == "clip":
        row["relevant"] = sum(relevance_pattern(int(video.shape[0]), args.relevant_frac,
                                                args.relevance))
    try:
        with e2e_memory.routers_offloaded(vr, enabled=dev.cuda and not routed):
            dev.release()
            for _ in range(args.warmup):
                call(vr, dev, video, args, max_length, budget, kw, rel)
            reports = [call(vr, dev, video, args, max_length, budget, kw, rel)
                       for _ in range(args.runs)]
    except (ValueError, RuntimeError) as e:  # BudgetError, OOM, ...: keep the other rows
        row["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        if dev.cuda:
            torch.cuda.empty_cache()
        return row
    row.update(summarise(reports))
    if row.get("budget_runtime") is not None and budgeted(kw) \
            and row["budget_runtime"] != budget:
        row["error"] = (f"runtime budget {row['budget_runtime']} != requested {budget}: the text "
                        f"token count differs from the runtime's")
    if dev.cuda:
        row["nvml_peak_gb"] = row.pop("outside_peak_gb")
    else:
        row["peak_mem_gb"] = row.pop("outside_peak_gb")  # CPU: process RSS peak
    if routed and rel is None and row.get("windows") is not None:
        row["relevant"] = sum(1 for w in row["windows"] if _norm(w) == _norm(kw["scales"][1]))
    return row


def text_tokens_for(vr, dev, args, video) -> int:
    """Text tokens of the full T-frame prompt (question, chat template and every frame's
    "FrameN: <img></img>" line), counted the way the runtime counts them for its budget."""
    return int(vr.lm.text_tokens(args.question, int(video.shape[0])))


def run_table(vr, dev, args, policies, frames, budget, sweep, rows, text_cache) -> None:
    """All policies at one (frames, budget) point. A sweep point equal to the main table's
    reuses its rows (marked ``reused_from``) instead of measuring the same thing twice."""
    if sweep != "main":
        same = [r for r in rows if r["sweep"] == "main" and r["frames"] == frames
                and r["budget"] == budget]
        if same:
            rows.extend(dict(r, sweep=sweep, reused_from="main") for r in same)
            return
    video = random_video(frames, args.seed)
    if frames not in text_cache:
        text_cache[frames] = text_tokens_for(vr, dev, args, video)
    max_length = budget + text_cache[frames] + args.max_new_tokens + args.margin
    relevant = None if routers_trained(vr) else relevance_pattern(frames, args.relevant_frac,
                                                                   args.relevance)
    for key, label, kw in policies:
        row = measure_row(vr, dev, args, video, key, label, kw, sweep=sweep, budget=budget,
                          max_length=max_length, relevant=relevant)
        rows.append(row)
        print(f"  [{sweep}] T={frames} B={budget} {label}: "
              + (row["error"] if row.get("error") else
                 f"{row['visual_tokens']} tokens, TTFT {row['ttft_s']:.3f} s"), flush=True)


def run_batch(vr, dev, args, policies, rows, text_cache) -> None:
    """B different videos per row: answer_batch when the runtime has one, else B sequential calls."""
    frames, budget = args.frames, args.budget
    videos = [random_video(frames, args.seed + i) for i in range(max(args.batch_sizes))]
    if frames not in text_cache:
        text_cache[frames] = text_tokens_for(vr, dev, args, videos[0])
    max_length = budget + text_cache[frames] + args.max_new_tokens + args.margin
    relevant = None if routers_trained(vr) else relevance_pattern(frames, args.relevant_frac,
                                                                   args.relevance)
    batched = hasattr(vr, "answer_batch")
    for B in args.batch_sizes:
        for key, label, kw in policies:
            fragment = needs_relevance(kw)
            routed = fragment and kw.get("scorer") != "clip"
            rel = relevant if fragment else None
            row = dict(sweep="batch", policy=key, label=label, frames=frames, budget=budget, batch=B,
                       batch_mode=(("answer_batch(batch_prefill=False): the videos one after "
                                    "another" if args.no_batch_prefill else
                                    "answer_batch: stages per video, then one batched prefill "
                                    "and decode")
                                   if batched else "sequential answer() calls (no answer_batch)"),
                       max_length=max_length)
            try:
                with e2e_memory.routers_offloaded(vr, enabled=dev.cuda and not routed):
                    dev.release()
                    runs = [batch_call(vr, dev, args, videos[:B], max_length, budget, kw, rel,
                                       batched)
                            for _ in range(args.warmup + args.runs)][args.warmup:]
            except (ValueError, RuntimeError) as e:
                row["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                rows.append(row)
                continue
            gb = lambda b: None if not b else b / 1e9  # noqa: E731
            walls = [w for w, _, _, _ in runs]
            reps = [r for _, _, _, got in runs for r in got]
            peaks = [p for _, p, _, _ in runs]
            outs = [o for _, _, o, _ in runs]
            row.update(
                visual_tokens=sum(r.get("visual_tokens") or 0 for r in runs[0][3]),
                ttft_s=median([r["timings_s"].get("ttft") for r in reps]),
                total_s=median(walls), per_video_s=median(walls) / B, runs=len(walls),
                peak_mem_gb=gb(max(p or 0 for p in peaks)) if dev.cuda else gb(max(o or 0 for o in outs)),
                nvml_peak_gb=gb(max(o or 0 for o in outs)) if dev.cuda else None)
            rows.append(row)
            print(f"  [batch] B={B} {label}: {row['total_s']:.3f} s for {B} videos "
                  f"({row['batch_mode']})", flush=True)


def batch_call(vr, dev, args, videos, max_length, budget, kw, rel, batched):
    """One timed pass over ``videos`` -> (wall s, torch peak, NVML/RSS peak, reports)."""
    dev.reset_peak()
    with dev.sampler() as s:
        dev.sync()
        t0 = time.perf_counter()
        if batched:  # the runtime's batched entry point, when it has one
            res = vr.answer_batch(videos, args.question,
                                  batch_prefill=not args.no_batch_prefill, options=answer_options(
                                      args, int(videos[0].shape[0]), max_length, budget, kw, rel))
            got = [r.report for r in res]
        else:
            got = [answer(vr, v, args, max_length, budget, kw, rel).report for v in videos]
        dev.sync()
        wall = time.perf_counter() - t0
    peak = (dev.torch_peak() or max((r.get("peak_memory_bytes") or 0) for r in got) or None) \
        if dev.cuda else None
    return wall, peak, s.peak, got
