"""Memory of a request (vr_runtime.telemetry.memory, report fields): CPU peaks in the report, the weights
counted by part (the shadow stack included), the compressed path's activation peak below
Dense's, and plan-first policies encoding their kept frames without copying all their pixels."""
import pytest
import torch

from vr_runtime.telemetry.memory import TorchAllocationPeak, weight_bytes
from vr_runtime.routing.scorers import FixedRelevance

Q = "Which color is the square in the video?"


def _bytes(module):
    return sum(t.numel() * t.element_size() for t in list(module.parameters()) + list(module.buffers()))


def test_report_gives_cpu_peak_activation_and_weights(tiny_vr, frames):
    r = tiny_vr.answer(frames(3, seed=1), Q, num_frames=3, max_new_tokens=2,
                       policy="global").report
    assert r["peak_memory_bytes"] > 0 and r["peak_memory_source"].startswith("CPU:")
    if "VmHWM" in r["peak_memory_source"]:   # the reset was permitted: the rise is this request's
        assert 0 <= r["peak_activation_bytes"] < r["peak_memory_bytes"]
    w = r["weights_bytes"]
    assert w == weight_bytes(tiny_vr)
    assert w["shadow_stack"] == _bytes(tiny_vr.routers.shadow) > 0
    assert w["router_heads"] == _bytes(tiny_vr.routers.semantic) + _bytes(tiny_vr.routers.image)
    assert w["language_model"] + w["vision"] == _bytes(tiny_vr.lm.model)
    assert w["total"] == sum(v for k, v in w.items() if k != "total")


def test_compressed_activation_peak_below_dense(tiny_lm, frames):
    """CPU, PyTorch allocator (profiler memory events): at 8 frames (2,048 dense visual tokens;
    vision one frame a call, so the prefill is what differs) the compressed paths -- Global, and
    Fragment with both routers run over every frame -- peak below Dense. The routers have the
    shipped tiny routers' shape (head width 64, router pool 2): with a head of width 256 over
    all 256 tokens of a frame, wider than this language model's 128, the Image Router's own
    activations would exceed the 2K-token prefill (an artefact of the tiny widths; see
    BENCHMARKS.md for the 8B shape). The 256-frame figures: bench/results/memory_cpu_tiny_256.md."""
    from vr_runtime.routing.routers import RouterConfig, Routers
    from vr_runtime.runtime import VideoRouter
    tiny_vr = VideoRouter(tiny_lm, Routers.from_backbone(
        tiny_lm, RouterConfig(router_dim=64, num_heads=4, router_pool=2)), warmup_frames=0)
    T = 8
    video = frames(T, seed=2)
    kw = dict(num_frames=T, max_new_tokens=1, chunk_size=1)
    peaks = {}
    runs = {"dense": dict(policy="dense", allow_over_length=True),
            "global": dict(policy="global"),
            "fragment": dict(policy="fragment", scorer=FixedRelevance(
                [t % 4 == 0 for t in range(T)], run_routers=True))}
    tiny_vr.answer(video, Q, **kw, policy="global")   # warm: lazily built tables are not counted
    for name, o in runs.items():
        with torch.inference_mode(), TorchAllocationPeak() as p:
            rep = tiny_vr.answer(video, Q, **kw, **o).report
        peaks[name] = (p.peak, rep["visual_tokens"])
    dense = peaks["dense"][0]
    assert peaks["dense"][1] == T * 256
    for name in ("global", "fragment"):
        assert peaks[name][1] < T * 256
        assert peaks[name][0] < 0.8 * dense, peaks


def test_kept_frames_are_encoded_chunk_by_chunk(tiny_vr, frames, monkeypatch):
    """A plan-first policy encodes only its kept frames, a chunk of pixels at a time (no copy of
    every kept frame at once), into the Z that encoding pv[keep] gives."""
    from vr_runtime.telemetry.timing import StageTimer
    pv = frames(7, seed=4)
    keep = [0, 2, 3, 5, 6]
    req = tiny_vr.request(pv, Q, num_frames=7, chunk_size=2, policy="global")
    f = tiny_vr.load_frames(req, StageTimer("cpu"))
    seen = []
    real = tiny_vr.lm.encode_frames
    monkeypatch.setattr(tiny_vr.lm, "encode_frames",
                        lambda x, c, **k: seen.append(x.shape[0]) or real(x, c, **k))
    Z = tiny_vr.encode(f, req, StageTimer("cpu"), None, keep)
    monkeypatch.undo()
    assert seen == [2, 2, 1]
    assert torch.equal(Z, tiny_vr.lm.encode_frames(pv[keep], 2))


def test_kept_rows_are_not_copied_out_of_z(tiny_vr, frames):
    """With a video cache, Z of every frame is packed in place with the dropped frames' window
    at 0 (no Z[keep] copy): the embeddings are bit for bit those of Z[keep] and the kept
    windows."""
    from vr_runtime.planning.policies import kept_frames
    from vr_runtime.reconstruct import reconstruct_embeds
    pv = frames(6, seed=5)
    tiny_vr.clear_visual_cache()
    p = tiny_vr.prepare(tiny_vr.request(pv, Q, num_frames=6, policy="budget", budget=512,
                                         cache_visual=True))
    keep = kept_frames(p.fitted.plan, tiny_vr.lm.grid)
    assert 0 < len(keep) < 6
    Z = tiny_vr.visual_cache.entries()[0].Z
    assert Z.shape[0] == 6
    want = reconstruct_embeds(tiny_vr.lm.model, p.ids, Z[keep], [p.fitted.plan[t] for t in keep],
                              tiny_vr.lm.image_token_id, tiny_vr.lm.grid)
    tiny_vr.clear_visual_cache()
    assert torch.equal(p.embeds, want)


@pytest.mark.gpu
def test_cuda_activation_peak_below_dense():
    """CUDA (bench/gpu_run.sh, stage tests): the report's peak minus the weights on the
    device, Dense against Global and Fragment with both routers run, tiny model, bf16."""
    from vr_runtime.runtime import VideoRouter
    vr = VideoRouter.from_pretrained("tiny", device="cuda", dtype="bf16", warm_request=False)
    T = 16
    video = torch.randn(T, 3, 448, 448, generator=torch.Generator().manual_seed(2))
    kw = dict(num_frames=T, max_new_tokens=1, chunk_size=1)
    runs = {"dense": dict(policy="dense", allow_over_length=True),
            "global": dict(policy="global"),
            "fragment": dict(policy="fragment", scorer=FixedRelevance(
                [t % 4 == 0 for t in range(T)], run_routers=True))}
    vr.answer(video, Q, **kw, policy="global")
    got = {}
    for name, o in runs.items():
        r = vr.answer(video, Q, **kw, **o).report
        assert r["peak_memory_source"].startswith("CUDA")
        assert r["weights_bytes"]["shadow_stack"] > 0
        got[name] = r["peak_activation_bytes"]
    assert got["global"] < got["dense"] and got["fragment"] < got["dense"], got
