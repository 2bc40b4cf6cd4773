"""FLOP and byte floors per stage at the InternVL3-8B shape, counted from the configs (MODEL
figures, nothing measured), beside the one H100 measurement and the goals.

    python -m bench.scripts.bench_floors [--out bench/results/floors_8b_model.json]

* Weights: counted from ``vr_runtime/configs/internvl3_8b.json`` by building the model on the
  ``meta`` device (no memory): vision tower, projector, language model, LM head; the routers'
  shadow stack (a 4-layer decoder of the same config) and heads (RouterConfig's defaults at
  D = 3,584: Image Router width 1,024), checked against ``cost_model.shadow_stack_bytes``.
* Stages (``vr_runtime.planning.cost_model``): vision, router, compress, prefill (``stage_costs``) and one
  decode step (``decode_step_costs``), for Dense and VideoRouter (s=2,4) at the paper's setting
  (64 frames, budget 12,288, 180 text tokens; VideoRouter 7,748 visual tokens as in the paper's
  table): FLOPs, bytes, the time floor at the H100's nominal peak (989 TFLOP/s dense bf16,
  3.35 TB/s) and at the cost model's H100 spec (70% / 90% of those).
* The goals table: each row's model figure, the one H100 measurement (2026-11-24) and the goal,
  with the ``bench/gpu_run.sh`` stage whose results fill the measured column.
* Memory: weights resident, KV caches and a rough activation floor per stage
  (``prefill_activation_bytes``), as a whole-process and an activation-only ratio to Dense.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
from typing import Dict, List, Optional

from bench.harness.results import RESULTS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONFIG = os.path.join(ROOT, "vr_runtime", "configs", "internvl3_8b.json")
FRAMES, BUDGET, TEXT = 64, 12288, 180
VR_TOKENS = 7748          # the paper's VideoRouter (s=2,4) row (28 relevant frames at 1x1, the rest 4x4)
DENSE_TOKENS = FRAMES * 256
NEW_TOKENS = 16           # bench_e2e.py's --max-new-tokens default (the batch row's decode)
ROUTER_CALL_TOKENS = 8192  # vr_runtime.routing.routers.MAX_ROUTER_TOKENS: tokens per shadow-stack call
VISION_CHUNK = 16         # AnswerOptions.chunk_size: frames per vision-tower call

# The one H100 run (2026-11-24, InternVL3-8B shape, random weights, 64 frames, budget 12,288),
# from its results files in bench/results/gpu_h100_2026-11-24 (README there: commands, versions).
H100_2026_11_24 = {
    "ttft_ratio": "0.68x", "ttft_s": "-", "router_share": "16%",
    "ttft_ratio_256": "-", "decode_ms": "20-45 ms wall (8.4 ms GPU work)",
    "batch4": "3.1x", "kernel": "88% / 65%", "memory": "1.01x",
}
GOALS = {
    "ttft_ratio": "<= 0.50x", "ttft_s": "<= 0.30 s", "router_share": "<= 5%",
    "ttft_ratio_256": "<= 0.25x", "decode_ms": "<= 7 ms", "batch4": "<= 2.0x",
    "kernel": ">= 90% / >= 85%, spread <= 10% over 3 processes", "memory": "<= 0.90x",
}
STAGE = {   # the bench/gpu_run.sh stage that measures each row, and its results file
    "ttft_ratio": "e2e (e2e_gpu_8b.json)", "ttft_s": "e2e (e2e_gpu_8b.json)",
    "router_share": "e2e (e2e_gpu_8b.json, e2e_gpu_8b_rp2.json)",
    "ttft_ratio_256": "frames (e2e_gpu_8b_frames.json)",
    "decode_ms": "decode (decode_gpu_8b.json)", "batch4": "batch (e2e_gpu_8b_batch.json)",
    "kernel": "kernels (pool_pack_gpu_8b.json, its 3 processes inside)",
    "memory": "e2e (e2e_gpu_8b.json: peak memory VideoRouter / Dense)",
}


def counted_weights(cfg: dict) -> Dict[str, int]:
    """Parameter counts from the config, on the meta device (bf16 bytes = 2 x count)."""
    import torch
    from transformers import AutoConfig, AutoModel, InternVLConfig, InternVLForConditionalGeneration

    from vr_runtime.routing.routers import ImageRouter, RouterConfig, SemanticRouter

    def n(m):
        return sum(p.numel() for p in m.parameters())
    with torch.device("meta"):
        model = InternVLForConditionalGeneration(InternVLConfig(**copy.deepcopy(cfg)))
        tc = dict(cfg["text_config"], num_hidden_layers=4, vocab_size=1)
        tcfg = AutoConfig.for_model(**tc)
        shadow = AutoModel.from_config(tcfg)
        rc = RouterConfig().resolved(int(cfg["text_config"]["hidden_size"]))
        heads = n(SemanticRouter(rc)) + n(ImageRouter(rc))
    inner = model.model
    vision = n(inner.vision_tower) + n(inner.multi_modal_projector)
    return dict(vision=vision, language_model=n(inner.language_model), lm_head=n(model.lm_head),
                shadow_stack=n(shadow.layers), router_heads=heads,
                model_total=n(model), router_dim=rc.router_dim)


def stages(s, nominal, model):
    """(per-stage rows, TTFT a method) for Dense and VideoRouter (s=2,4), at the nominal peak
    and at the cost model's H100 spec, with one decode step at the mid-answer context."""
    from vr_runtime.planning.cost_model import decode_step_costs, predict_ttft, stage_costs
    GB, G = 1e9, 1e9
    cases = [("Dense", DENSE_TOKENS, False, 1), ("VideoRouter (s=2,4)", VR_TOKENS, True, 1),
             ("VideoRouter (s=2,4), router pool 2", VR_TOKENS, True, 2)]
    stage_rows, ttft = [], {}
    for name, vt, routers, pool in cases:
        st = stage_costs(s, vt, TEXT, FRAMES, nominal, routers=routers, router_pool=pool)
        stm = predict_ttft(s, vt, TEXT, FRAMES, model, routers=routers, router_pool=pool)["stages_s"]
        ttft[name] = dict(nominal=sum(v["seconds"] for v in st.values()), model=sum(stm.values()),
                          router_nominal=st["router"]["seconds"], router_model=stm["router"])
        for stage in ("vision", "router", "compress", "prefill"):
            stage_rows.append(dict(method=name, stage=stage, gflop=st[stage]["flops"] / G,
                                   gbytes=st[stage]["bytes"] / GB,
                                   floor_ms=st[stage]["seconds"] * 1e3,
                                   model_ms=stm[stage] * 1e3))
        ctx = vt + TEXT + NEW_TOKENS // 2
        dn, dm = decode_step_costs(s, ctx, nominal), decode_step_costs(s, ctx, model)
        stage_rows.append(dict(method=name, stage=f"decode (1 token, {ctx:,} cached)",
                               gflop=dn["flops"] / G, gbytes=dn["bytes"] / GB,
                               floor_ms=dn["seconds"] * 1e3, model_ms=dm["seconds"] * 1e3))
        ttft[name]["decode_nominal"], ttft[name]["decode_model"] = dn["seconds"], dm["seconds"]
    return stage_rows, ttft


def memory(s, w) -> Dict[str, float]:
    """Weights resident plus the largest stage's activations (bf16, GB; a rough floor)."""
    from vr_runtime.planning.cost_model import kv_cache_bytes, prefill_activation_bytes
    GB = 1e9
    bf = 2
    weights_dense = w["model_total"] * bf                   # baselines: routers offloaded
    weights_vr = weights_dense + (w["shadow_stack"] + w["router_heads"]) * bf
    Z = FRAMES * 256 * s.d * bf
    vision_act = VISION_CHUNK * s.vis_tokens * (3 * s.d_vis + 2 * s.vis_ff) * bf + Z
    router_act = Z + prefill_activation_bytes(s, ROUTER_CALL_TOKENS, bf, kv_cache=False)
    emb = lambda n: n * s.d * bf   # noqa: E731  inputs_embeds of the prompt
    act_dense = max(vision_act, emb(DENSE_TOKENS + TEXT)
                    + prefill_activation_bytes(s, DENSE_TOKENS + TEXT, bf))
    act_vr = max(vision_act, router_act,
                 emb(VR_TOKENS + TEXT) + prefill_activation_bytes(s, VR_TOKENS + TEXT, bf))
    mem = dict(weights_dense_gb=weights_dense / GB, weights_vr_gb=weights_vr / GB,
               shadow_stack_gb=w["shadow_stack"] * bf / GB,
               shadow_stack_gib=w["shadow_stack"] * bf / 2**30,
               router_heads_gb=w["router_heads"] * bf / GB,
               kv_dense_gb=kv_cache_bytes(s, DENSE_TOKENS + TEXT) / GB,
               kv_vr_gb=kv_cache_bytes(s, VR_TOKENS + TEXT) / GB,
               vision_activation_gb=vision_act / GB, router_activation_gb=router_act / GB,
               activation_dense_gb=act_dense / GB, activation_vr_gb=act_vr / GB,
               peak_dense_gb=(weights_dense + act_dense) / GB,
               peak_vr_gb=(weights_vr + act_vr) / GB)
    mem["peak_ratio"] = mem["peak_vr_gb"] / mem["peak_dense_gb"]
    mem["activation_ratio"] = act_vr / act_dense

    return mem


def goal_table(s, nominal, ttft, mem, ctx, d256, v256, one, four, fwd, bwd) -> List[Dict]:
    """The goals table: each row's model figure beside the H100 measurement and the goal."""
    from vr_runtime.planning.cost_model import decode_step_costs
    GB = 1e9
    dense, vr = ttft["Dense"], ttft["VideoRouter (s=2,4)"]
    vr2 = ttft["VideoRouter (s=2,4), router pool 2"]
    f2 = lambda x: f"{x:.2f}x"  # noqa: E731
    model_col = {
        "ttft_ratio": f"{f2(vr['model'] / dense['model'])} (router pool 2: "
                      f"{f2(vr2['model'] / dense['model'])})",
        "ttft_s": f"{vr['model']:.3f} s (floor at nominal peak {vr['nominal']:.3f} s)",
        "router_share": f"{100 * vr['router_model'] / vr['model']:.0f}% (router pool 2: "
                        f"{100 * vr2['router_model'] / vr2['model']:.0f}%)",
        "ttft_ratio_256": f"{f2(v256 / d256)} (Dense {d256:.2f} s, VideoRouter {v256:.2f} s)",
        "decode_ms": f"{vr['decode_model'] * 1e3:.2f} ms (floor {vr['decode_nominal'] * 1e3:.2f} "
                     f"ms: {decode_step_costs(s, ctx, nominal)['bytes'] / GB:.1f} GB read a token)",
        "batch4": f"{f2(four / one)} ({NEW_TOKENS} new tokens: the TTFT stages are compute-bound "
                  f"and scale by 4; decode steps read the weights once for 4 rows)",
        "kernel": f"100% / 100% (the same bytes as the copy: fwd {fwd / 1e6:.0f} MB, bwd "
                  f"{bwd / 1e6:.0f} MB, {fwd / 3.35e12 * 1e6:.0f} / {bwd / 3.35e12 * 1e6:.0f} us at "
                  f"3.35 TB/s)",
        "memory": f"{f2(mem['peak_ratio'])} whole process, {f2(mem['activation_ratio'])} "
                  f"activations (see the memory table)",
    }
    names = {"ttft_ratio": "TTFT VideoRouter (s=2,4) / Dense", "ttft_s": "TTFT VideoRouter (s=2,4)",
             "router_share": "router share of TTFT", "ttft_ratio_256": "TTFT ratio at 256 frames",
             "decode_ms": "decode, per token (batch 1)", "batch4": "4 videos vs 1 (time)",
             "kernel": "pool_pack fwd / bwd, % of a same-bytes copy",
             "memory": "peak memory VideoRouter / Dense"}
    goal_rows = [dict(row=names[k], model=model_col[k], h100_2026_11_24=H100_2026_11_24[k],
                      goal=GOALS[k], gpu_run="pending", measured_by=STAGE[k]) for k in names]
    return goal_rows


def floor_notes(w, mem, text256) -> List[str]:
    notes = [
        "MODEL figures, not measurements: counted from vr_runtime/configs/internvl3_8b.json "
        "(vr_runtime/planning/cost_model.py). 'floor' = max(FLOPs / 989 TFLOP/s, bytes / 3.35 TB/s) per "
        "operator (H100 SXM nominal dense bf16 and HBM3); 'model' = the cost model's H100 spec "
        "(70% / 90% of those), the figures BENCHMARKS.md's predicted tables use.",
        "The H100 column is the one run of 2026-11-24 (8B shape, random weights, 64 frames, budget "
        "12,288; bench/results/gpu_h100_2026-11-24); it predates the batched pool_pack, the memory "
        "changes, static/graph decoding and the router-pool plumbing. 'GPU run' is what "
        "`bash bench/gpu_run.sh` fills (the stage named per row).",
        f"Shapes: {FRAMES} frames, {TEXT} text tokens, Dense {DENSE_TOKENS:,} and VideoRouter "
        f"(s=2,4) {VR_TOKENS:,} visual tokens; 256 frames: ~{text256} text tokens, VideoRouter at "
        f"budget {BUDGET:,}; decode at the context reached mid-way through {NEW_TOKENS} new tokens.",
        f"Weights counted on the meta device: model {w['model_total']:,} parameters (vision + "
        f"projector {w['vision']:,}, language model {w['language_model']:,}, LM head "
        f"{w['lm_head']:,}); shadow stack {w['shadow_stack']:,} = 4 x "
        f"{w['shadow_stack'] // 4:,} ({mem['shadow_stack_gb']:.2f} GB = "
        f"{mem['shadow_stack_gib']:.2f} GiB bf16; cost_model.shadow_stack_bytes agrees); router "
        f"heads {w['router_heads']:,} (Image Router width {w['router_dim']}).",
        "Memory: weights resident (Dense: the model alone, as bench_e2e offloads the routers for "
        "the baselines; VideoRouter: + shadow stack + heads) plus the largest stage's "
        "activations, a rough floor: vision = one chunk of 16 frames through a ViT layer + Z; "
        f"router = Z + one {ROUTER_CALL_TOKENS:,}-token shadow-stack call's layer transient; "
        "prefill = inputs_embeds + KV cache + one layer's transient (prefill_activation_bytes). "
        "The allocator's reserve, the CUDA context and the workspaces are not in it.",
    ]
    return notes


def main(argv: Optional[List[str]] = None) -> Dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(RESULTS, "floors_8b_model.json"))
    args = ap.parse_args(argv)
    import torch

    from bench.harness.env import environment
    from bench.harness.results import report
    from bench.harness.tables import markdown_table
    from vr_runtime.planning.cost_model import (DEVICES, DeviceSpec, decode_step_costs, load_shape,
                                                pool_pack_bytes, predict_ttft, shadow_stack_bytes)
    with open(CONFIG) as f:
        cfg = json.load(f)
    s = load_shape(cfg)
    w = counted_weights(cfg)
    assert w["shadow_stack"] * 2 == shadow_stack_bytes(s, 4, 2), "shadow stack: count != formula"
    nominal = DeviceSpec("NVIDIA H100 SXM (nominal peak)", 989e12, 3.35e12, 0.0, 2, "model")
    model = DEVICES["h100"]
    stage_rows, ttft = stages(s, nominal, model)
    vr = ttft["VideoRouter (s=2,4)"]

    # ---- 256 frames: Dense 65,536 visual tokens; VideoRouter at the same budget 12,288
    text256 = TEXT + (256 - FRAMES) * 8        # ~8 text tokens a frame line ("FrameN: <img></img>")
    d256 = predict_ttft(s, 256 * 256, text256, 256, model, routers=False)["ttft_s"]
    v256 = predict_ttft(s, BUDGET, text256, 256, model, routers=True)["ttft_s"]

    # ---- 4 videos vs 1 (bench_e2e --sweep batch: 16 new tokens, batched prefill + decode)
    ctx = VR_TOKENS + TEXT + NEW_TOKENS // 2
    one = vr["model"] + (NEW_TOKENS - 1) * decode_step_costs(s, ctx, model, 1)["seconds"]
    four = 4 * vr["model"] + (NEW_TOKENS - 1) * decode_step_costs(s, ctx, model, 4)["seconds"]

    # ---- pool_pack at the paper shape (VideoRouter (s=2,4): 64 kept frames -> 7,748 rows)
    fwd = (FRAMES * 256 * s.d + VR_TOKENS * s.d) * 2
    bwd = (VR_TOKENS * s.d + FRAMES * 256 * s.d) * 2

    mem = memory(s, w)
    goal_rows = goal_table(s, nominal, ttft, mem, ctx, d256, v256, one, four, fwd, bwd)
    env = environment(torch.device("cpu"))
    notes = floor_notes(w, mem, text256)
    body = ["## Goals: model, the one H100 measurement, the goal", "",
            markdown_table(goal_rows, ["row", "model", "h100_2026_11_24", "goal", "gpu_run",
                                       "measured_by"],
                           ["row", "model (H100 spec)", "H100 measured 2026-11-24", "goal",
                            "H100/H200 now", "gpu_run.sh stage (file)"]),
            "", "## Per stage (64 frames)", "",
            markdown_table(stage_rows, ["method", "stage", "gflop", "gbytes", "floor_ms",
                                        "model_ms"],
                           ["method", "stage", "GFLOP", "GB moved", "floor ms (nominal peak)",
                            "model ms (H100 spec)"]),
            "", "## Memory (bf16, GB; rough model)", "",
            markdown_table([mem], list(mem.keys()))]
    head = [f"Model figures from the configs; computed {env['date_utc']}, command: "
            f"`python -m bench.scripts.bench_floors`."]
    return report(args.out, "# FLOP and byte floors per stage, InternVL3-8B shape (model, not "
                  "measured)", env, notes, body, head=head, label="model", weights_counted=w,
                  stages=stage_rows, ttft=ttft, goals=goal_rows, memory=mem,
                  ttft_256=dict(dense_s=d256, videorouter_s=v256, text_tokens=text256),
                  batch4=dict(one_s=one, four_s=four),
                  pool_pack_bytes=dict(fwd=fwd, bwd=bwd,
                                       torch_path_fwd=pool_pack_bytes(FRAMES * 256, VR_TOKENS,
                                                                      s.d, 2, False)))


if __name__ == "__main__":
    main()
