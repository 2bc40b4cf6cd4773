"""The JSON report of one answer (docs/CONTRACT.md section 3 fields and extras), built from the pipeline's
typed stage results in one place."""
from __future__ import annotations

from typing import List, Optional

from vr_kernels import pooled_counts
from vr_kernels.windows import normalize_window

STAGES = ("decode", "vision", "router", "compress", "prefill", "generate")
TTFT_STAGES = ("vision", "router", "compress", "prefill")   # after decoding, as in the paper


def json_window(w):
    nw = normalize_window(w)
    if nw is None:
        return 0
    return nw[0] if nw[0] == nw[1] else [nw[0], nw[1]]


def build_report(vr, req, frames, decision, scores, fitted, prompt_tokens: int,
                 generated: int, timer, notes: List[str], visual_cache: Optional[str]) -> dict:
    """``req``: request.Request, ``frames``: runtime.Frames, ``decision``: PolicyDecision,
    ``scores``: FrameScores or None, ``fitted``: policies.FittedPlan."""
    lm = vr.lm
    grid = lm.grid
    plan = fitted.plan
    counts = pooled_counts(plan, grid)
    T = len(plan)
    t = timer.times
    timings = {k: round(t.get(k, 0.0), 6) for k in STAGES}
    if frames.decode_s is not None and frames.decode_s > 0:
        timings["decode"] = round(float(frames.decode_s), 6)  # includes a prefetch that overlapped
    timings["ttft"] = round(sum(t.get(k, 0.0) for k in TTFT_STAGES), 6)
    fragment = scores is not None   # only relevance policies (fragment, fragment-literal) score
    from .memory import device_weight_bytes, weight_bytes
    weights = weight_bytes(vr)
    peak, peak_source, activation = timer.peak(
        device_weight_bytes(vr, lm.device) if timer.device.type == "cuda" else 0)
    return {
        "model": lm.name,
        "backbone": lm.family,
        "device": str(lm.device),
        "dtype": str(lm.dtype).replace("torch.", ""),
        "policy": decision.policy,
        "policy_requested": req.policy,
        "policy_probability": decision.probability,
        "routers_trained": vr.routers_trained,
        "scorer": scores.source if scores is not None else None,
        "num_frames_requested": int(req.num_frames),
        "num_frames_used": T,
        "decoder": frames.decoder,
        "codec": frames.codec,
        "seek": getattr(frames, "seek", None),
        "frame_indices": [int(i) for i in frames.indices],
        "frame_times_s": None if frames.times_s is None else [round(float(x), 4) for x in frames.times_s],
        "frame_scores": None if scores is None or scores.scores is None
        else [round(float(s), 6) for s in scores.scores],
        "router_pool": scores.router_pool if scores is not None else None,
        "visual_cache": visual_cache,
        "relevant": scores.relevant if fragment and scores is not None else None,
        "scales": [json_window(w) for w in plan],
        "frame_tokens": counts,
        "frames_kept": sum(1 for c in counts if c > 0),
        # Algorithm 1 found no relevant frame: `fragment` fell back to the Global plan,
        # `fragment-literal` put every frame at s0 (the eval tables count how often)
        "no_relevant_frame": bool(fragment and not any(scores.relevant)),
        "visual_tokens": int(sum(counts)),
        "dense_visual_tokens": T * grid[0] * grid[1],
        "budget": fitted.budget,
        "max_length": int(req.max_length),
        "text_tokens": int(fitted.text_tokens),
        "prompt_tokens": int(prompt_tokens),
        "generated_tokens": int(generated),
        "timings_s": timings,
        # CUDA: the allocator's peak; CPU: the process's resident high-water mark over the
        # request; "peak_memory_source" says which. Activation = the request's own memory: CUDA,
        # peak minus the weights on the device; CPU, the resident set's rise over the request.
        "peak_memory_bytes": peak,
        "peak_memory_source": peak_source,
        "peak_activation_bytes": activation,
        "weights_bytes": weights,
        "peak_memory_nvml_bytes": timer.nvml_peak,
        "notes": notes,
    }


__all__ = ["build_report", "json_window", "STAGES", "TTFT_STAGES"]
