"""The Qwen3-VL backbone (vr_runtime/backbones/qwen3_vl.py) on tiny-qwen3-vl: Hugging Face's
own forward and generate on the processor's video input at window 1 (first-step logits and
greedy tokens), DeepStack in the shadow stack against HF's hidden states, units (temporal
patches) and timestamps, pooled positions, every policy through the runtime, router weights of
another backbone, the shape presets and the cost shape."""
import json
import pathlib
import types

import pytest
import torch

from vr_runtime.backbones.qwen3_vl import (FRAME_SIZE, QWEN3_MEAN, Qwen3VLBackbone, group_units,
                                           unit_patches, unit_times)
from vr_runtime.reconstruct import reconstruct_embeds

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "vr_runtime" / "configs"
Q = "Which color is the star in the video?"
FPS = 24.0
INDICES = [0, 13, 25, 38, 50, 63]   # six sampled frames: three temporal patches


@pytest.fixture(scope="module")
def bb():
    return Qwen3VLBackbone.tiny(device="cpu", dtype=torch.float32)


def _frames(T, seed=0):
    return torch.randn(T, 3, *FRAME_SIZE, generator=torch.Generator().manual_seed(seed))


def _patchify(frames):
    """The video processor's patchify of one video [T, 3, H, W] -> (patches, t, h, w): its own
    method where the installed transformers has one (newer 5.x), else the same view/permute
    its _preprocess does inline (5.5.4)."""
    import importlib
    try:
        vp = importlib.import_module("transformers.models.qwen3_vl.video_processing_qwen3_vl")
        fn = getattr(vp.Qwen3VLVideoProcessor, "patchify", None)
    except ImportError:   # a release that needs torchvision even to define the class
        fn = None
    if callable(fn):
        p, t, h, w = fn(None, frames[None], patch_size=16, merge_size=2, temporal_patch_size=2)
        return p[0], t, h, w
    T, C, H, W = frames.shape
    x = frames[None].view(1, T // 2, 2, C, H // 32, 2, 16, W // 32, 2, 16)
    x = x.permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
    return x.reshape(T // 2 * (H // 16) * (W // 16), C * 2 * 16 * 16), T // 2, H // 16, W // 16


def _expand_video(text, thw, indices, fps):
    """The processor's expansion of the chat template's one video block: its own
    replace_video_token where the installed transformers has it (newer 5.x); in 5.5.4 the same
    loop sits inside Qwen3VLProcessor.__call__ and is written out here. Timestamps from the
    processor's own _calculate_timestamps either way."""
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.video_utils import VideoMetadata
    block = "<|vision_start|><|video_pad|><|vision_end|>"
    stamps = Qwen3VLProcessor._calculate_timestamps(None, list(indices), fps, 2)
    replace = getattr(Qwen3VLProcessor, "replace_video_token", None)
    if replace is not None:
        stub = types.SimpleNamespace(
            video_processor=types.SimpleNamespace(merge_size=2, temporal_patch_size=2),
            vision_start_token="<|vision_start|>", vision_end_token="<|vision_end|>",
            video_token="<|video_pad|>",
            _calculate_timestamps=lambda i, f, m: Qwen3VLProcessor._calculate_timestamps(
                None, i, f, m))
        meta = VideoMetadata(total_num_frames=max(indices) + 1, fps=fps,
                             frames_indices=list(indices))
        expanded = replace(stub, {"video_grid_thw": thw, "video_metadata": [meta]}, 0)
    else:
        n = int(thw[0, 1:].prod()) // 4
        expanded = "".join(f"<{stamps[t]:.1f} seconds><|vision_start|>" + "<|video_pad|>" * n +
                           "<|vision_end|>" for t in range(int(thw[0, 0])))
    return text.replace(block, expanded, 1)


def _processor_inputs(bb, frames, indices=INDICES, fps=FPS, question=Q):
    """What Qwen3VLProcessor makes of this video and question: the chat template's video block
    expanded as the processor expands it (timestamps from the frames' indices and fps), and the
    video processor's patches. (The processor classes need torchvision to be built, which this
    project does not install; their methods are called unbound.)"""
    from vr_runtime.backbones.prompt import render_chat
    T = frames.shape[0]
    patches, gt, gh, gw = _patchify(frames)
    thw = torch.tensor([[gt, gh, gw]])
    text = _expand_video(render_chat(bb.tokenizer, "<|vision_start|><|video_pad|><|vision_end|>"
                                     + question), thw, indices, fps)
    ids = torch.tensor([bb.tokenizer(text, add_special_tokens=False)["input_ids"]])
    assert T % 2 == 0 and gt == T // 2
    return {"input_ids": ids, "pixel_values_videos": patches, "video_grid_thw": thw,
            "mm_token_type_ids": (ids == bb.image_token_id).int() * 2}


def _ours(bb, frames, plan, indices=INDICES, fps=FPS, question=Q):
    """The runtime's path: units, Z, prompt with the units' times, pool_pack into wide
    inputs_embeds, M-RoPE positions."""
    pv, _, times = bb.units(frames, indices, [i / fps for i in indices])
    Z = bb.encode_frames(pv)
    from vr_kernels import pooled_counts
    ids, starts = bb.build_prompt(question, pooled_counts(plan, bb.grid), times=times)
    keep = [t for t, w in enumerate(plan) if w]
    E = reconstruct_embeds(bb.model, ids, Z[keep], [plan[t] for t in keep], bb.image_token_id,
                           bb.grid, frame_starts=starts)
    return ids, E, bb.position_ids(ids, [plan[t] for t in keep], starts), Z


# ----------------------------------------------------------------------------- preset
def test_tiny_preset_and_units(bb):
    cfg = bb.model.config
    vc, tc = cfg.vision_config, cfg.text_config
    assert bb.grid == (14, 14) and bb.frame_spec.size == FRAME_SIZE
    assert bb.frame_spec.mean == QWEN3_MEAN and bb.frames_per_unit == 2
    assert (vc.patch_size, vc.spatial_merge_size, vc.temporal_patch_size) == (16, 2, 2)
    assert tc.rope_parameters["mrope_interleaved"] and bb.streams == 4
    assert bb.image_token_id == cfg.video_token_id == \
        bb.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    # frames -> units: pairs, an odd last frame repeated; the processor's mean time
    f = _frames(5)
    pv, idx, times = bb.units(f, [0, 2, 4, 6, 8], [0.0, 1.0, 2.0, 3.0, 4.0])
    assert pv.shape == (3, 6, *FRAME_SIZE) and idx == [0, 4, 8] and times == [0.5, 2.5, 4.0]
    assert torch.equal(pv[1, 3:], f[3]) and torch.equal(pv[2, :3], pv[2, 3:])
    assert group_units(3, 2) == [[0, 1], [2, 2]] and bb.unit_labels([0, 1, 0, 0, 1]) == [1, 0, 1]
    # our patches are the video processor's
    assert torch.equal(unit_patches(pv[:2]), _patchify(f[:4])[0])
    with pytest.raises(ValueError, match=r"expected units \[U, 6, H, W\]"):
        bb.encode_frames(f)


def test_prompt_has_timestamps_and_drops_a_unit_whole(bb):
    ids, starts = bb.build_prompt(Q, [3, 0, 2], times=[0.26, 1.0, 12.34])
    text = bb.tokenizer.decode(ids)
    assert ("<0.3 seconds><|vision_start|>" + "<|video_pad|>" * 3 +
            "<|vision_end|><12.3 seconds><|vision_start|>") in text
    assert "<1.0 seconds>" not in text and text.endswith("<|im_start|>assistant\n")
    n = bb.text_tokens(Q, 3, kept=[0, 2], times=[0.26, 1.0, 12.34])
    assert n == ids.numel() - 5
    with pytest.raises(ValueError, match="2 unit times for 3 units"):
        bb.build_prompt(Q, [1, 1, 1], times=[0.0, 1.0])


# ----------------------------------------------------------------------------- against HF
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
def test_window1_equals_hf_forward_and_generate(dtype, tol):
    """Every unit at window 1: the prompt ids are the processor's, the first-step logits equal
    HF's forward on the processor's output, and greedy decoding gives HF generate's tokens."""
    b = Qwen3VLBackbone.tiny(dtype=dtype)
    frames = _frames(len(INDICES), seed=3)
    ref = _processor_inputs(b, frames)
    ids, E, pos, _ = _ours(b, frames, [1, 1, 1])
    assert torch.equal(ids, ref["input_ids"][0])
    with torch.no_grad():
        hf = b.model(**ref).logits[0, -1].float()
        ours = b.forward(inputs_embeds=E, position_ids=pos).logits[0, -1].float()
        scale = hf.abs().max().item()
        assert (ours - hf).abs().max().item() <= tol * max(scale, 1.0)
        n = 6
        gen = b.model.generate(**ref, max_new_tokens=n, do_sample=False,
                               eos_token_id=sorted(b.stop_token_ids()), pad_token_id=0)
        hf_tokens = gen[0, ids.numel():].tolist()
        from vr_runtime.runtime import VideoRouter
        vr = VideoRouter(b, warmup_frames=0)
        mine = vr.generate(E, n, position_ids=pos)
    stops = b.stop_token_ids()
    hf_tokens = hf_tokens[:next((i for i, t in enumerate(hf_tokens) if t in stops), n)]
    assert mine == hf_tokens and len(mine) > 0


def test_deepstack_router_features_equal_hf_hidden_states(bb):
    """The shadow stack's features after layer k (k = 1..4) on [Z_t; q] equal HF's
    output_hidden_states[k] on the same unit and question, with DeepStack stream k added at the
    visual rows (HF records a layer's output before its injection: what layer k + 1 reads), and
    for the last layer HF's final norm of it."""
    from vr_runtime.routing.routers import RouterConfig, Routers, embed_question
    pv, _, _ = bb.units(_frames(2, seed=5), [0, 1], None)
    Z = bb.encode_frames(pv)
    q_ids = bb.tokenizer(Q, add_special_tokens=False)["input_ids"]
    N, D = Z.shape[1], bb.hidden_size
    ids = torch.tensor([[bb.image_token_id] * N + q_ids])
    with torch.no_grad():
        hs = bb.model(input_ids=ids, pixel_values_videos=unit_patches(pv),
                      video_grid_thw=torch.tensor([[1, 28, 28]]),
                      mm_token_type_ids=(ids == bb.image_token_id).int() * 2,
                      output_hidden_states=True).hidden_states
    q = embed_question(bb.model, bb.tokenizer, Q)
    pos = bb.router_position_ids(bb.grid, len(q_ids), 1)
    for k in (1, 2, 3, 4):
        r = Routers.from_backbone(bb, RouterConfig(num_layers=k))
        x = torch.cat([Z, torch.cat([q, q.new_zeros(len(q_ids), Z.shape[-1] - D)], -1)[None]], 1)
        with torch.no_grad():
            H = r.shadow(x, position_ids=pos)
            ref = hs[k].clone()
            if k < bb.streams:
                ref[0, :N] += Z[0, :, k * D:(k + 1) * D]
            else:
                H = bb.decoder().norm(H)
        torch.testing.assert_close(H, ref, rtol=1e-5, atol=1e-5)
    # the cached (prefix + question) path gives the same frame logits
    r = Routers.from_backbone(bb, RouterConfig(router_dim=32, num_heads=4))
    with torch.no_grad():
        full = r.frame_logits(Z, q, grid=bb.grid)
        cached = r.frame_logits_cached(r.visual_cache(Z, grid=bb.grid), q)
    torch.testing.assert_close(full, cached, rtol=1e-4, atol=1e-5)


def test_pooled_units_positions_match_rope_index(bb):
    """A pooled or dropped unit: positions equal get_rope_index with each kept unit a block of
    its pooled grid; logits finite."""
    frames = _frames(len(INDICES), seed=7)
    ids, E, pos, _ = _ours(bb, frames, [2, 0, 4])
    mm = (ids == bb.image_token_id).int()[None] * 2
    thw = torch.tensor([[1, 14, 14], [1, 8, 8]])
    ref, _ = bb.model.model.get_rope_index(ids[None], mm_token_type_ids=mm, video_grid_thw=thw)
    assert torch.equal(pos, ref)
    with torch.no_grad():
        assert torch.isfinite(bb.forward(inputs_embeds=E, position_ids=pos).logits).all()


# ----------------------------------------------------------------------------- runtime
@pytest.fixture(scope="module")
def vr(bb):
    from vr_runtime.runtime import VideoRouter
    return VideoRouter(bb, warmup_frames=0)


def _clip(T=8, seed=11):
    idx = list(range(0, 6 * T, 6))
    return types.SimpleNamespace(pixel_values=_frames(T, seed), frame_indices=idx,
                                 timestamps_s=[i / FPS for i in idx], note=None)


@pytest.mark.parametrize("policy", ["auto", "global", "fragment", "budget", "uniform"])
def test_every_policy_at_scales_1_is_dense(vr, policy):
    """--scales 1,1,1 with a budget that holds every unit: each policy is dense's answer; and
    with a smaller fixed budget the visual tokens stay within it."""
    clip = _clip()
    kw = dict(num_frames=8, max_new_tokens=3, global_window=1, relevant_window=1, other_window=1)
    dense = vr.answer(clip, Q, policy="dense", **kw)
    r = vr.answer(clip, Q, policy=policy, budget=4 * 196, **kw)
    assert r.text == dense.text and r.report["visual_tokens"] == 4 * 196
    assert r.report["dense_visual_tokens"] == 4 * 196 and r.report["backbone"] == "qwen3_vl"
    small = vr.answer(clip, Q, policy=policy, budget=2 * 196 + 5, max_new_tokens=1,
                      num_frames=8).report
    assert 0 < small["visual_tokens"] <= 2 * 196 + 5


def test_budget_fitted_to_max_length_with_timestamps(vr):
    r = vr.answer(_clip(), Q, num_frames=8, max_length=700, max_new_tokens=2,
                  policy="global").report
    assert r["prompt_tokens"] == r["text_tokens"] + r["visual_tokens"]
    assert r["visual_tokens"] <= r["budget"] and r["prompt_tokens"] + 2 + 100 <= 700


def test_router_weights_of_another_backbone_are_refused(bb, tmp_path):
    from vr_runtime.backbones import load_backbone
    from vr_runtime.errors import RouterWeightsError
    from vr_runtime.routing.routers import RouterConfig, Routers
    other = load_backbone("tiny-qwen2.5-vl")   # same hidden size and depth
    Routers.from_backbone(other, RouterConfig(router_dim=32, num_heads=4)).save(tmp_path / "r.st")
    with pytest.raises(RouterWeightsError, match="trained on a qwen2_5_vl backbone") as e:
        Routers.load(tmp_path / "r.st", bb)
    assert "\n" not in str(e.value)
    Routers.from_backbone(bb, RouterConfig(router_dim=32, num_heads=4)).save(tmp_path / "q.st")
    assert Routers.load(tmp_path / "q.st", bb).backbone == "qwen3_vl"


def test_unsupported_family_names_the_supported_ones(tmp_path):
    from vr_runtime.backbones import load_backbone
    from vr_runtime.errors import ModelFilesError
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen2_vl"}))
    with pytest.raises(ModelFilesError) as e:
        load_backbone(d)
    msg = str(e.value)
    assert "\n" not in msg and "'qwen2_vl' is not supported" in msg
    assert "qwen3_vl" in msg and "qwen2_5_vl" in msg and "internvl" in msg


# ----------------------------------------------------------------------------- presets
@pytest.mark.parametrize("name,params,fields", [
    ("2b", 2_127_532_032, dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16,
                               num_key_value_heads=8, intermediate_size=6144)),
    ("8b", 8_767_123_696, dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                               num_key_value_heads=8, intermediate_size=12288)),
])
def test_shape_presets(name, params, fields):
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
    d = json.loads((CONFIGS / f"qwen3_vl_{name}.json").read_text())
    d.pop("_comment")
    cfg = Qwen3VLConfig.from_dict(d)
    tc = cfg.text_config
    assert {k: getattr(tc, k) for k in fields} == fields
    assert tc.rope_parameters["mrope_section"] == [24, 20, 20]
    assert tc.rope_parameters["mrope_interleaved"]
    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration._from_config(cfg)
    assert sum(p.numel() for p in model.parameters()) == params
    from vr_runtime.planning.cost_model import load_shape
    s = load_shape(str(CONFIGS / f"qwen3_vl_{name}.json"))
    assert s.tokens_per_frame == 196 and s.vis_tokens == 784 and s.d == fields["hidden_size"]
    assert s.patch_dim == 3 * 2 * 16 * 16


def test_from_config_random_weights():
    d = json.loads((CONFIGS / "qwen3_vl_8b.json").read_text())
    d["text_config"].update(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=32, intermediate_size=96,
                            rope_scaling={"rope_type": "default", "mrope_section": [4, 6, 6],
                                          "mrope_interleaved": True})
    d["vision_config"].update(depth=2, hidden_size=32, num_heads=2, intermediate_size=48,
                              out_hidden_size=64, deepstack_visual_indexes=[0, 1])
    b = Qwen3VLBackbone.from_config(d, seed=1)
    assert b.streams == 3 and b.image_token_id == b.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    with torch.no_grad():
        _, E, pos, Z = _ours(b, _frames(2, seed=2), [2], indices=[0, 1])
        assert Z.shape == (1, 196, 3 * 64)
        assert torch.isfinite(b.forward(inputs_embeds=E, position_ids=pos).logits).all()


def test_ask_serve_eval_take_a_qwen3_vl_directory(bb, tmp_path, cli_here):
    """A checkpoint directory as a user downloads it (config, safetensors, tokenizer, chat
    template, the processor's files): Qwen3VLBackbone.load gives the same logits, and
    `videorouter ask` answers from it (serve and eval resolve models the same way)."""
    from vr_runtime.backbones import load_backbone
    from vr_runtime.backbones.tiny import ASSETS
    d = tmp_path / "Qwen3-VL-tiny-Instruct"
    bb.model.save_pretrained(str(d))
    bb.tokenizer.save_pretrained(str(d))
    (d / "preprocessor_config.json").write_text(json.dumps(
        {"image_processor_type": "Qwen2VLImageProcessorFast", "patch_size": 16, "merge_size": 2,
         "temporal_patch_size": 2, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}))
    (d / "video_preprocessor_config.json").write_text(json.dumps(
        {"video_processor_type": "Qwen3VLVideoProcessor", "patch_size": 16, "merge_size": 2,
         "temporal_patch_size": 2, "fps": 2}))
    loaded = load_backbone(d)
    assert type(loaded) is Qwen3VLBackbone and loaded.name == d.name
    ids = torch.tensor([[5, 60, 70, 2]])
    with torch.no_grad():
        torch.testing.assert_close(loaded.forward(input_ids=ids).logits,
                                   bb.forward(input_ids=ids).logits, rtol=0, atol=0)
    out = cli_here("ask", ASSETS.parent / "sample.mp4", Q, "--model", d, "--frames", "4",
                   "--max-length", "1200", "--max-new-tokens", "2", "--policy", "global", "--json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)["report"]
    assert r["backbone"] == "qwen3_vl" and r["windows"] == [2, 2]   # 4 frames, 2 temporal patches
    assert len(r["frame_times_s"]) == 2


def test_clip_scores_a_unit_as_its_best_frame(vr, tmp_path):
    """The CLIP scorers read units of two frames: a unit's similarity is its best frame's, and
    `--scorer clip-fill` runs on Qwen3-VL."""
    from vr_runtime.eval.synthetic import make_random_clip
    from vr_runtime.routing.scorers import CLIPScorer
    clip = CLIPScorer.from_pretrained(make_random_clip(tmp_path))
    c = _clip()
    spec = vr.lm.frame_spec
    per_frame = clip.similarities(c.pixel_values, spec, Q)
    pv, _, _ = vr.lm.units(c.pixel_values, c.frame_indices, None)
    torch.testing.assert_close(clip.similarities(pv, spec, Q), per_frame.view(4, 2).max(1).values)
    r = vr.answer(c, Q, num_frames=8, max_new_tokens=1, policy="fragment", budget=2 * 196 + 40,
                  scorer=clip).report
    assert r["scorer"] == "clip" and len(r["frame_scores"]) == 4
    assert r["visual_tokens"] <= 2 * 196 + 40


def test_budget_resize_view_and_rule(bb):
    """budget-resize on Qwen3-VL: the rule counts temporal patches (ceil(F / 2) units) at
    factor 32, never above full size; the view at the chosen size equals HF's forward on the
    same units at that size (window 1), and the model itself is untouched."""
    assert bb.budget_frame_size(64, 12288) == (448, 448)          # 32 x 196 fits already
    h, w = bb.budget_frame_size(64, 3000)
    assert 32 * (h // 32) * (w // 32) <= 3000 < 32 * (h // 32 + 1) * (w // 32 + 1)
    with pytest.raises(ValueError, match="multiples of 32"):
        bb.at_resolution(224, 250)
    v = bb.at_resolution(224, 256)
    assert v.grid == (7, 8) and v.frame_spec.size == (224, 256) and bb.grid == (14, 14)
    frames = torch.randn(4, 3, 224, 256, generator=torch.Generator().manual_seed(8))
    pv, _, times = v.units(frames, [0, 1, 2, 3], [0.0, 0.5, 1.0, 1.5])
    ids, starts = v.build_prompt(Q, [56, 56], times=times)
    with torch.no_grad():
        Z = v.encode_frames(pv)
        E = reconstruct_embeds(v.model, ids, Z, [1, 1], v.image_token_id, v.grid,
                               frame_starts=starts)
        ours = v.forward(inputs_embeds=E, position_ids=v.position_ids(ids, [1, 1], starts))
        ref = v.model(**v.reference_inputs(ids, pv)).logits[0, -1]
    torch.testing.assert_close(ours.logits[0, -1], ref, rtol=1e-4, atol=1e-4)


def test_moe_window1_equals_hf_and_routes(tmp_path):
    """Qwen3-VL MoE (tiny-qwen3-vl-moe): the same equivalence with HF's forward and generate,
    the shadow stack's MoE layers (experts copied) give the LLM's features after layer 4, a
    policy at scales 1,1,1 is dense's answer, and router weights of the dense family are
    refused."""
    from vr_runtime.backbones.qwen3_vl import Qwen3VLMoeBackbone
    from vr_runtime.errors import RouterWeightsError
    from vr_runtime.routing.routers import RouterConfig, Routers, embed_question
    from vr_runtime.runtime import VideoRouter
    b = Qwen3VLMoeBackbone.tiny()
    assert type(b.decoder().layers[0].mlp).__name__.endswith("SparseMoeBlock")
    frames = _frames(4, seed=12)
    ref = _processor_inputs(b, frames, indices=INDICES[:4])
    ids, E, pos, Z = _ours(b, frames, [1, 1], indices=INDICES[:4])
    assert torch.equal(ids, ref["input_ids"][0])
    with torch.no_grad():
        torch.testing.assert_close(b.forward(inputs_embeds=E, position_ids=pos).logits[0, -1],
                                   b.model(**ref).logits[0, -1], rtol=1e-4, atol=1e-4)
        gen = b.model.generate(**ref, max_new_tokens=4, do_sample=False,
                               eos_token_id=sorted(b.stop_token_ids()), pad_token_id=0)
        vr = VideoRouter(b, warmup_frames=0)
        mine = vr.generate(E, 4, position_ids=pos)
    stops = b.stop_token_ids()
    hf = gen[0, ids.numel():].tolist()
    assert mine == hf[:next((i for i, t in enumerate(hf) if t in stops), 4)]
    # the shadow stack over MoE layers, with DeepStack: the LLM's features after layer 4
    q_ids = b.tokenizer(Q, add_special_tokens=False)["input_ids"]
    unit = Z[:1]
    x_ids = torch.tensor([[b.image_token_id] * unit.shape[1] + q_ids])
    pv, _, _ = b.units(frames[:2], [0, 1], None)
    with torch.no_grad():
        hs = b.model(input_ids=x_ids, pixel_values_videos=unit_patches(pv),
                     video_grid_thw=torch.tensor([[1, 28, 28]]),
                     mm_token_type_ids=(x_ids == b.image_token_id).int() * 2,
                     output_hidden_states=True).hidden_states[4]
        q = embed_question(b.model, b.tokenizer, Q)
        x = torch.cat([unit, torch.cat([q, q.new_zeros(len(q_ids), unit.shape[-1] - q.shape[-1])],
                                       -1)[None]], 1)
        r = Routers.from_backbone(b, RouterConfig(router_dim=32, num_heads=4))
        H = b.decoder().norm(r.shadow(x, position_ids=b.router_position_ids(b.grid, len(q_ids), 1)))
    torch.testing.assert_close(H, hs, rtol=1e-5, atol=1e-5)
    c = _clip(4)
    kw = dict(num_frames=4, max_new_tokens=3, global_window=1, relevant_window=1, other_window=1)
    assert vr.answer(c, Q, policy="fragment", budget=2 * 196, **kw).text == \
        vr.answer(c, Q, policy="dense", **kw).text
    r.save(tmp_path / "moe.st")
    with pytest.raises(RouterWeightsError, match="trained on a qwen3_vl_moe backbone"):
        Routers.load(tmp_path / "moe.st", Qwen3VLBackbone.tiny())


def test_moe_shape_preset():
    """Qwen3-VL-30B-A3B as released: 31.07B parameters; the cost model's MLP is the active
    experts' width (8 x 768)."""
    from transformers import Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration
    d = json.loads((CONFIGS / "qwen3_vl_30b_a3b.json").read_text())
    d.pop("_comment")
    cfg = Qwen3VLMoeConfig.from_dict(d)
    tc = cfg.text_config
    assert (tc.num_experts, tc.num_experts_per_tok, tc.moe_intermediate_size,
            tc.num_hidden_layers, tc.hidden_size) == (128, 8, 768, 48, 2048)
    with torch.device("meta"):
        model = Qwen3VLMoeForConditionalGeneration._from_config(cfg)
    assert sum(p.numel() for p in model.parameters()) == 31_070_754_032
    from vr_runtime.planning.cost_model import load_shape
    s = load_shape(str(CONFIGS / "qwen3_vl_30b_a3b.json"))
    assert s.ff == 8 * 768 and s.tokens_per_frame == 196 and s.layers == 48
    assert s.hd == 128 != s.d // s.heads   # Qwen3's head_dim, not hidden / heads


def test_ttft_budget_on_qwen3_vl(vr):
    """--ttft-budget: the cost model takes Qwen3-VL's cost shape (a unit is a frame of the
    model) and the warm probe encodes units."""
    r = vr.answer(_clip(), Q, num_frames=8, max_new_tokens=1, policy="global",
                  ttft_budget_s=30.0).report
    assert r["ttft_predicted_s"] > 0 and r["visual_tokens"] <= r["budget"]
