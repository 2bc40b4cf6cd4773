"""What loading a :class:`~vr_runtime.runtime.pipeline.VideoRouter` runs besides the backbone:
its routers (a file, an object, or fresh ones; the tiny preset's shipped file when none is given)
and the load-time warm-ups -- the pool_pack kernels compiled and autotuned, and one throw-away
request through every stage -- so that no user request pays for compilation or lazy loading."""
from __future__ import annotations

import pathlib
import time
from typing import Optional

import torch

import vr_kernels

from ..backbones.tiny import ASSETS
from ..generate import DEFAULT_WARM_SLOTS, use_compile_cache
from ..routing.compiled import RouterRunner
from ..routing.routers import RouterConfig, Routers, pooled_grid
from ..routing.scorers import FixedRelevance


def preset_routers(path_or_name, routers):
    """``routers``, or for the ``"tiny"`` preset without any the shipped
    ``assets/tiny/routers.safetensors`` (when it is there)."""
    if routers is None and str(path_or_name) == "tiny":
        shipped = ASSETS / "routers.safetensors"
        if shipped.is_file():
            return shipped
    return routers


def routers_for(lm, routers, router_config: Optional[RouterConfig]) -> Routers:
    """The routers of ``lm``: a :class:`Routers` moved onto the model (its positions the
    model's), a safetensors path loaded, or None: fresh ones (``router_config``)."""
    if isinstance(routers, Routers):
        routers.positions = lm.router_position_ids
        return routers.to_model(lm.device, lm.dtype)
    if routers is not None:
        return Routers.load(pathlib.Path(routers), lm)  # built on the model's device/dtype
    return Routers.from_backbone(lm, router_config)


def kernel_warmup(lm, warmup_frames: int) -> dict:
    """Compile and autotune the pool_pack kernels now (CUDA; a no-op on CPU), for up to
    ``warmup_frames`` frames, so that no request pays for compilation (0: skip)."""
    if not warmup_frames:
        return {"skipped": "warmup_frames=0"}
    return vr_kernels.warmup(lm.hidden_size, lm.dtype, lm.device, lm.grid,
                             max_frames=warmup_frames)


def router_runner(routers: Routers, grid, options) -> Optional[RouterRunner]:
    """The Image Router's fixed-shape runner for ``options`` (``CompileOptions``), at the
    routers' own ``router_pool``; None when it would run eagerly on the default chunks (the
    eager path then stays the one every release before ran)."""
    tg = pooled_grid(grid, routers.config.router_pool)
    runner = RouterRunner(routers, tg[0] * tg[1], options.router_chunk, options.router)
    if runner.mode == "off" and options.router_chunk is None:
        return None
    return runner


def compiled_stages(vr) -> list:
    """The stages of ``vr`` that torch.compile runs: "decode", "vision", "router"."""
    runner = vr.routers.runner
    return [name for name, on in (("decode", vr.greedy.compiles),
                                  ("vision", vr.vision.mode != "off"),
                                  ("router", runner is not None and runner.mode != "off")) if on]


def compile_warmup(vr) -> dict:
    """Compile the compiled stages now, so that no request pays for it: the vision tower on one
    chunk, the Image Router for a one-bucket question, the decode step for the largest cache
    expected. Seconds per stage (0 when eager)."""
    slots = vr.compile.decode_slots or DEFAULT_WARM_SLOTS
    if compiled_stages(vr):
        use_compile_cache(vr.compile.cache_dir)   # a later process finds what compiles now
    out = {"decode": vr.greedy.warm_up(slots), "vision": vr.vision.warm_up()}
    runner = vr.routers.runner
    if runner is None:
        out["router"] = {"mode": "off", "chunk": None, "seconds": 0.0}
    else:
        tg = pooled_grid(vr.lm.grid, vr.routers.config.router_pool)
        width = vr.lm.hidden_size * vr.lm.streams
        out["router"] = runner.warm_up(tg, width)
    return out


def warmup_line(vr) -> str:
    """What loading compiled and warmed, in one line: each stage's mode and seconds, so that an
    operator sees that no first request will pay a compile."""
    c = vr.compile_warmup
    parts = [f"decoding {vr.greedy.mode}" + (f" (compiled in {c['decode']['seconds']:.1f} s)"
                                            if c["decode"]["seconds"] else "")]
    for stage in ("vision", "router"):
        w = c[stage]
        how = [f"chunk {w['chunk']}"] if w["chunk"] else []
        how += [f"compiled in {w['seconds']:.1f} s"] if w["mode"] != "off" else []
        parts.append(f"{stage} {w['mode']}" + (f" ({', '.join(how)})" if how else ""))
    req = vr.request_warmup
    parts.append(f"warm-up request {req['seconds']:.1f} s" if "seconds" in req else
                 "no warm-up request")
    return "loaded: " + ", ".join(parts)


def throwaway_answer(vr, num_frames: int = 8, max_new_tokens: int = 2) -> dict:
    """Answer one throw-away question on random frames through every stage a request runs
    (vision, both routers, pool_pack, prefill, decode steps), then forget it (the visual cache
    is cleared): what the kernel warm-up cannot reach (CUDA's lazy module loading, the GEMM and
    attention kernel choices, the shadow stack's first call) is paid at load, not by the first
    user."""
    spec = vr.lm.frame_spec
    frames = torch.randn(num_frames, 3, *spec.size, generator=torch.Generator().manual_seed(0))
    relevant = [t % 2 == 0 for t in range(num_frames)]   # both windows of the Fragment plan
    t0 = time.perf_counter()
    vr.answer(frames, "What happens in the video?", num_frames=num_frames,
              max_new_tokens=max_new_tokens, policy="fragment",
              scorer=FixedRelevance(relevant, run_routers=True))
    if torch.device(vr.lm.device).type == "cuda":
        torch.cuda.synchronize(vr.lm.device)
    vr.clear_visual_cache()
    return {"seconds": round(time.perf_counter() - t0, 6), "frames": num_frames,
            "max_new_tokens": max_new_tokens}


__all__ = ["preset_routers", "routers_for", "kernel_warmup", "router_runner", "compiled_stages",
           "compile_warmup", "throwaway_answer", "warmup_line"]
