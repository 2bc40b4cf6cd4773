"""Shape presets (vr_runtime/configs/internvl3_*.json) and a CPU smoke run of bench/scripts/bench_e2e.py.

The preset checks build each InternVLConfig and instantiate the model on the meta device, so no
weight memory is allocated: they compare the shapes with the public InternVL3-*-hf checkpoints
(Qwen2.5 text backbones, InternViT-300M-448px vision tower) and check that one 448x448 frame
gives a 16x16 grid of 256 visual tokens after pixel shuffle and the projector."""
import json
import pathlib
import time

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "vr_runtime" / "configs"

# name: (text hidden, layers, heads, KV heads, MLP, parameters in billions as published)
TEXT = {
    "1b": (896, 24, 14, 2, 4864, 0.9),
    "2b": (1536, 28, 12, 2, 8960, 2.1),
    "8b": (3584, 28, 28, 4, 18944, 7.9),
}


def _config(name):
    from transformers import InternVLConfig
    return InternVLConfig.from_dict(json.loads((CONFIGS / f"internvl3_{name}.json").read_text()))


@pytest.mark.parametrize("name", sorted(TEXT))
def test_preset_shapes(name):
    from transformers import InternVLForConditionalGeneration
    cfg = _config(name)
    hidden, layers, heads, kv, mlp, billions = TEXT[name]
    t, v = cfg.text_config, cfg.vision_config
    assert (cfg.model_type, t.model_type, v.model_type) == ("internvl", "qwen2", "internvl_vision")
    assert (t.hidden_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads,
            t.intermediate_size, t.vocab_size) == (hidden, layers, heads, kv, mlp, 151674)
    assert t.max_position_embeddings == 32768
    theta = getattr(t, "rope_theta", None) or t.rope_parameters["rope_theta"]
    assert theta == 1e6
    assert (v.hidden_size, v.num_hidden_layers, v.num_attention_heads, v.intermediate_size) == (
        1024, 24, 16, 4096)
    assert tuple(v.image_size) == (448, 448) and tuple(v.patch_size) == (14, 14)
    assert v.norm_type == "layer_norm" and v.attention_bias and not v.use_qk_norm
    assert cfg.downsample_ratio == 0.5 and cfg.image_seq_length == 256
    assert cfg.vision_feature_layer == -1 and cfg.vision_feature_select_strategy == "default"

    with torch.device("meta"):
        model = InternVLForConditionalGeneration(cfg)
        out = model.model.get_image_features(pixel_values=torch.zeros(1, 3, 448, 448))
    feats = getattr(out, "pooler_output", out)  # a tensor on older transformers, an output on newer
    # 448 / 14 = 32x32 patches, pixel shuffle 0.5 -> 16x16 = 256 tokens of the text width.
    assert tuple(feats.shape) == (1, 256, hidden)
    n = sum(p.numel() for p in model.parameters()) / 1e9
    assert abs(n - billions) < 0.1, f"{name}: {n:.3f}B parameters, published {billions}B"
    # The published checkpoints keep a separate lm_head (the counts above include it).
    assert model.lm_head.weight is not model.get_input_embeddings().weight


# ----------------------------------------------------------------------------- the harness
def test_relevance_patterns():
    from bench.scripts import bench_e2e
    from vr_runtime import uniform_sample
    spread = bench_e2e.relevance_pattern(64, 28 / 64, "spread")
    assert sum(spread) == 28
    assert [t for t in range(64) if spread[t]] == uniform_sample(list(range(64)), 28)
    block = bench_e2e.relevance_pattern(64, 28 / 64, "clustered")
    idx = [t for t in range(64) if block[t]]
    assert idx == list(range(18, 46))  # one centred run of 28
    assert sum(bench_e2e.relevance_pattern(8, 28 / 64, "spread")) == 4  # 3.5 rounds half up


def test_peak_sampler_sees_a_transient_allocation():
    from bench.models import e2e_memory
    read = e2e_memory.rss_reader()
    if read is None:
        pytest.skip("no /proc on this platform")
    size = 96 * 2**20
    with e2e_memory.PeakSampler(read, interval_s=0.001) as s:
        base = read()
        buf = bytearray(b"\x01") * size  # filled, so every page is resident
        time.sleep(0.05)
        del buf
    after = read()
    assert s.peak >= base + 0.9 * size
    assert s.peak > after  # the buffer is gone again: the sampler kept the peak, not the end


def test_ratios_and_targets():
    import argparse
    from bench.scripts import bench_e2e
    from bench.report import e2e_report
    rows = [dict(sweep="main", policy="dense", frames=64, budget=12288, ttft_s=2.0, peak_mem_gb=30.0),
            dict(sweep="main", policy="vr24", frames=64, budget=12288, ttft_s=0.7, router_s=0.05,
                 peak_mem_gb=19.0),
            dict(sweep="frames", policy="vr24", frames=16, budget=12288, ttft_s=0.2, peak_mem_gb=18.0)]
    e2e_report.add_ratios(rows)
    assert rows[0]["ttft_x_dense"] == 1.0 and rows[1]["ttft_x_dense"] == pytest.approx(0.35)
    assert rows[2]["ttft_x_dense"] is None  # no Dense row at that sweep point: no ratio
    args = argparse.Namespace(shape="8b", text_layers=None, vision_layers=None, frames=64,
                              budget=12288)
    t = bench_e2e.check_targets(rows, args, cuda=True)
    assert t["applies"] and t["passed"]
    rows[1]["router_s"] = 0.1  # 14% of TTFT
    t = bench_e2e.check_targets(rows, args, cuda=True)
    assert not t["passed"] and not t["checks"]["router <= 8% of TTFT"]
    assert not bench_e2e.check_targets(rows, args, cuda=False)["applies"]


def test_fixed_relevance_runs_the_routers_and_imposes_the_pattern():
    """The benchmark's VideoRouter rows: both routers really run (timed in the router stage)
    and the plan follows the imposed pattern, through the runtime's FrameScorer seam."""
    from vr_runtime import VideoRouter, plan_fragment
    from vr_runtime.backbones import load_backbone
    from vr_runtime.routing.scorers import FixedRelevance
    tiny_vr = VideoRouter(load_backbone("tiny"))   # untrained routers: only their cost matters
    video = torch.randn(5, 3, 448, 448, generator=torch.Generator().manual_seed(2))
    calls = []
    r = tiny_vr.routers
    hooks = [r.semantic.register_forward_hook(lambda *a: calls.append("semantic")),
             r.image.register_forward_hook(lambda *a: calls.append("image"))]
    pattern = [True, False, True, False, False]
    try:
        res = tiny_vr.answer(video, "Which color is the star?", num_frames=5,
                             max_length=4000, max_new_tokens=1, policy="fragment", budget=700,
                             scorer=FixedRelevance(pattern, run_routers=True))
    finally:
        for h in hooks:
            h.remove()
    rep = res.report
    assert "semantic" in calls and "image" in calls
    assert rep["timings_s"]["router"] > 0 and rep["relevant"] == pattern
    assert rep["windows"] == plan_fragment(pattern, 700) and rep["budget"] == 700
    without = tiny_vr.answer(video, "Which color is the star?", num_frames=5,
                             max_length=4000, max_new_tokens=1, policy="fragment", budget=700,
                             scorer=FixedRelevance(pattern)).report
    assert without["windows"] == rep["windows"] and without["timings_s"]["router"] < \
        rep["timings_s"]["router"]
    with pytest.raises(ValueError, match="relevant"):
        tiny_vr.answer(video, "Which color?", num_frames=5, max_new_tokens=1,
                       policy="fragment", scorer=FixedRelevance([True]))


def test_cpu_mode_end_to_end(tmp_path):
    """The CPU mode at its smallest (tiny preset, 4 frames, one run): every row runs, token counts
    match the planner, the routers really run in the VideoRouter rows, files are complete."""
    import csv
    from bench.scripts import bench_e2e
    from bench.models import e2e_measure
    from vr_runtime import plan_budget, plan_dense, plan_fragment, plan_tokens, plan_uniform
    threads = torch.get_num_threads()
    stem = tmp_path / "e2e_smoke"
    try:
        assert bench_e2e.main(["--cpu", "--shape", "tiny", "--frames", "4", "--runs", "1",
                               "--warmup", "0", "--threads", "1", "--max-new-tokens", "2",
                               "--sweep", "batch", "--batch-sizes", "2", "--out", str(stem)]) == 0
    finally:
        torch.set_num_threads(threads)
    doc = json.loads(stem.with_suffix(".json").read_text())
    env = doc["environment"]
    assert env["device"].startswith("CPU") and env["torch"] and env["transformers"] and env["date_utc"]
    assert "bench_e2e" in env["command"] or "pytest" in env["command"]
    assert doc["label"].startswith("CPU figures")
    s = doc["settings"]
    T, B = 4, 4 * 192
    assert (s["frames"], s["budget"]) == (T, B) and s["router_layers"] == 1
    # the label names the mechanism the rows really use (the scorer seam, policy fragment)
    assert "FixedRelevance(pattern, run_routers=True)" in s["router_mode_detail"]
    assert "policy 'fragment'" in s["router_mode_detail"]
    rel = bench_e2e.relevance_pattern(T, 28 / 64, "spread")
    expect = {"dense": plan_dense(T), "budget": plan_budget(T, B), "uniform": plan_uniform(T, B),
              "vr24": plan_fragment(rel, B, relevant_window=1, other_window=4, global_window=2),
              "vr48": plan_fragment(rel, B, relevant_window=1, other_window=8, global_window=4)}
    rows = {r["policy"]: r for r in doc["rows"] if r["sweep"] == "main"}
    assert set(rows) == set(expect) | {"clip"}
    # The CLIP row: CLIP really runs (timed as routing), and it keeps as many frames at s1 as
    # the VideoRouter rows mark relevant (token-matched), whichever frames CLIP prefers.
    clip = rows["clip"]
    assert not clip.get("error"), clip.get("error")
    assert clip["router_s"] > 0 and clip["policy_run"] == "fragment"
    assert sum(1 for w in clip["windows"] if e2e_measure._norm(w) == (1, 1)) == sum(rel) == \
        clip["relevant"]
    assert clip["visual_tokens"] == rows["vr24"]["visual_tokens"]
    for key, plan in expect.items():
        r = rows[key]
        assert not r.get("error"), r.get("error")
        assert r["visual_tokens"] == plan_tokens(plan), key
        parts = r["vision_s"] + r["router_s"] + r["compress_s"] + r["prefill_s"]
        assert r["ttft_s"] == pytest.approx(parts, rel=1e-3, abs=1e-5)
        if key.startswith("vr"):
            assert r["router_s"] > 0 and r["policy_run"] == "fragment"
            assert r["budget_runtime"] == B
            assert [e2e_measure._norm(w) for w in r["windows"]] == [e2e_measure._norm(w) for w in plan]
        else:
            assert r["router_s"] == 0
    assert rows["dense"]["ttft_x_dense"] == 1.0
    batch = {r["policy"]: r for r in doc["rows"] if r["sweep"] == "batch"}
    assert set(batch) == set(expect) | {"clip"}
    for key, r in batch.items():  # two different videos, same plan each
        assert not r.get("error") and r["batch"] == 2
        assert r["visual_tokens"] == 2 * rows[key]["visual_tokens"]
        assert r["per_video_s"] == pytest.approx(r["total_s"] / 2)
    with stem.with_suffix(".csv").open() as f:
        assert len(list(csv.DictReader(f))) == 12
    assert "CPU figures" in stem.with_suffix(".md").read_text()
    assert stem.with_suffix(".png").stat().st_size > 10_000


def test_trained_routers_decide(tmp_path):
    """With router weights marked trained, the VideoRouter rows use the routers' own decisions
    (policy auto, no imposed pattern) and the results say so."""
    from bench.scripts import bench_e2e
    from vr_runtime import VideoRouter
    vr = VideoRouter.from_pretrained("tiny")
    vr.routers.trained = True
    path = tmp_path / "routers.safetensors"
    vr.routers.save(path)
    threads = torch.get_num_threads()
    stem = tmp_path / "e2e_trained"
    try:
        assert bench_e2e.main(["--cpu", "--shape", "tiny", "--frames", "4", "--runs", "1",
                               "--warmup", "0", "--threads", "1", "--max-new-tokens", "1",
                               "--policies", "dense,vr24", "--no-plot", "--routers", str(path),
                               "--out", str(stem)]) == 0
    finally:
        torch.set_num_threads(threads)
    doc = json.loads(stem.with_suffix(".json").read_text())
    assert doc["settings"]["routers_trained"] is True
    assert doc["settings"]["router_mode"].startswith("trained")
    row = next(r for r in doc["rows"] if r["policy"] == "vr24")
    assert not row.get("error") and row["router_s"] > 0
    assert row["policy_run"] in ("global", "fragment")
    assert not stem.with_suffix(".png").exists()


@pytest.mark.gpu
def test_gpu_mode_small(tmp_path):
    """On a GPU: a 1B-shape run at 16 frames; torch and NVML peaks are both recorded and the
    driver-level figure is at least the allocator's."""
    from bench.scripts import bench_e2e
    stem = tmp_path / "e2e_gpu"
    assert bench_e2e.main(["--shape", "1b", "--frames", "16", "--budget", "3072", "--runs", "2",
                           "--warmup", "1", "--policies", "dense,budget,vr24", "--out",
                           str(stem)]) == 0
    doc = json.loads(stem.with_suffix(".json").read_text())
    assert doc["label"] == "GPU figures" and doc["environment"]["cuda"]
    for r in doc["rows"]:
        assert not r.get("error"), r["error"]
        assert r["peak_mem_gb"] > 1.8  # the 1B weights alone are ~1.9 GB in bf16
        if r.get("nvml_peak_gb") is not None:
            assert r["nvml_peak_gb"] >= r["peak_mem_gb"]
    dense, vr = (next(r for r in doc["rows"] if r["policy"] == p) for p in ("dense", "vr24"))
    assert vr["visual_tokens"] < dense["visual_tokens"] and vr["router_s"] > 0


@pytest.mark.gpu
def test_routers_offloaded_for_baselines():
    """On a GPU the baselines run with the shadow stack off the device, and it comes back."""
    from bench.models import e2e_memory
    from vr_runtime import VideoRouter
    vr = VideoRouter.from_pretrained("tiny", device="cuda")
    before = torch.cuda.memory_allocated()
    with e2e_memory.routers_offloaded(vr):
        assert all(p.device.type == "cpu" for p in vr.routers.parameters())
        assert torch.cuda.memory_allocated() < before
    assert all(p.device.type == "cuda" for p in vr.routers.parameters())
    assert torch.cuda.memory_allocated() == before
