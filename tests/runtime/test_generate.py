"""Greedy decoding (vr_runtime.generate, issue 21 items 2 and 4): the static-cache path and batched
prefill give the tokens of the original eager dynamic-cache loop, on both tiny backbones
(InternVL3: 1-D positions; Qwen2.5-VL: M-RoPE), for several prompts and lengths. The reference
is that loop written out plainly here, with every step's logits recorded, so a wrong position
or mask shows even where the tiny models repeat one token."""
import warnings

import pytest
import torch

from vr_runtime.backbones.base import output_cache
from vr_runtime.generate import GreedyDecoder, resolve_decoding
from vr_runtime.runtime import VideoRouter

QUESTIONS = ["What shape is the red object?",
             "Which color is the big square that appears in the middle of the video?",
             "Is there a star?"]


@pytest.fixture(scope="module", params=["tiny", "tiny-qwen2.5-vl"])
def vr(request):
    from vr_runtime.backbones import load_backbone
    torch.manual_seed(0)
    return VideoRouter(load_backbone(request.param, device="cpu", dtype=torch.float32),
                       warmup_frames=0, decoding="dynamic")


@pytest.fixture(scope="module")
def prompts(vr):
    return make_prompts(vr)


def make_prompts(vr):
    """Three prompts of different lengths (frames, question, budget)."""
    g = torch.Generator().manual_seed(5)
    out = []
    for T, q, budget in zip((3, 4, 2), QUESTIONS, (300, 420, 200)):
        v = torch.randn(T, 3, 448, 448, generator=g)
        out.append(vr.prepare(vr.request(v, q, num_frames=T, max_new_tokens=8,
                                          policy="uniform", budget=budget)))
    assert len({p.embeds.shape[1] for p in out}) == 3
    return out


def reference(lm, embeds, position_ids, n, stop_ids=()):
    """The original loop: eager, DynamicCache, one token at a time -> (ids, logits per step)."""
    out = lm.forward(inputs_embeds=embeds, position_ids=position_ids)
    logits = [out.logits[0, -1].clone()]
    nxt = out.logits[:, -1].argmax(-1)
    pos = lm.next_position(position_ids, embeds.shape[1])
    cache, gen = output_cache(out), []
    tok = int(nxt)
    while len(gen) < n and tok not in stop_ids:
        gen.append(tok)
        if len(gen) == n:
            break
        o = lm.forward(input_ids=nxt.view(1, 1), past_key_values=cache,
                       position_ids=lm.step_position_ids(pos))
        pos += 1
        cache = output_cache(o)
        logits.append(o.logits[0, -1].clone())
        nxt = o.logits[:, -1].argmax(-1)
        tok = int(nxt)
    return gen, logits[:len(gen)]


def recorded(lm, monkeypatch):
    """Every decode step's last-row logits [B, V] (the prefill's are read per row apart)."""
    steps = []
    orig = lm.forward

    def forward(**kw):
        o = orig(**kw)
        if kw.get("input_ids") is not None:
            steps.append(o.logits[:, -1].clone())
        return o
    monkeypatch.setattr(lm, "forward", forward)
    return steps


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_one_request_equals_the_reference(vr, prompts, mode, monkeypatch):
    dec = GreedyDecoder(vr.lm, mode, bucket=64)
    for p, n in zip(prompts, (1, 3, 6)):
        want, want_logits = reference(vr.lm, p.embeds, p.position_ids, n)
        steps = recorded(vr.lm, monkeypatch)
        got = dec.generate([p.embeds], [n], [p.position_ids], set())[0]
        monkeypatch.undo()
        assert got == want and len(got) == n
        for a, b in zip(steps, want_logits[1:]):
            torch.testing.assert_close(a[0], b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_batch_equals_one_by_one(vr, prompts, mode, monkeypatch):
    """Right-padded prompts of three lengths, different token limits: every row's tokens and
    step logits are those of the request alone."""
    limits = [5, 2, 4]
    refs = [reference(vr.lm, p.embeds, p.position_ids, n) for p, n in zip(prompts, limits)]
    steps = recorded(vr.lm, monkeypatch)
    dec = GreedyDecoder(vr.lm, mode, bucket=64)
    got = dec.generate([p.embeds for p in prompts], limits, [p.position_ids for p in prompts],
                       set())
    monkeypatch.undo()
    assert got == [r[0] for r in refs]
    for b, (_, want_logits) in enumerate(refs):
        for k, want in enumerate(want_logits[1:]):
            torch.testing.assert_close(steps[k][b], want, rtol=1e-4, atol=1e-4)


def test_batch_rows_stop_on_their_own(vr, prompts):
    first = reference(vr.lm, prompts[0].embeds, prompts[0].position_ids, 1)[0][0]
    others = [reference(vr.lm, p.embeds, p.position_ids, 6, stop_ids={first})[0]
              for p in prompts]
    for mode in ("dynamic", "static"):
        got = GreedyDecoder(vr.lm, mode, bucket=64).generate(
            [p.embeds for p in prompts], [6] * 3, [p.position_ids for p in prompts], {first})
        assert got == others and got[0] == []


def test_answer_batch_equals_answers(vr):
    g = torch.Generator().manual_seed(9)
    videos = [torch.randn(T, 3, 448, 448, generator=g) for T in (3, 2, 4)]
    kw = dict(max_new_tokens=6, policy="uniform", budget=360)
    alone = [vr.answer(v, q, num_frames=v.shape[0], **kw) for v, q in zip(videos, QUESTIONS)]
    for batch_prefill in (True, False):
        got = vr.answer_batch(videos, QUESTIONS, num_frames=4, batch_prefill=batch_prefill, **kw)
        assert [a.text for a in got] == [a.text for a in alone]
        for a, b in zip(got, alone):
            assert a.report["windows"] == b.report["windows"]
            assert a.report["generated_tokens"] == b.report["generated_tokens"]
            assert a.report["decoding"] == "dynamic"
            assert any("one batch of 3" in n for n in a.report["notes"]) == batch_prefill


def test_one_pool_pack_for_the_batch(vr, monkeypatch):
    """answer_batch pools every request's kept frames with ONE pool_pack call into one
    right-padded inputs_embeds; its rows are bit for bit each request's own embeddings (the
    padding zeros), and the answers are the one-by-one answers (plans of different windows,
    dropped frames: Fragment with fixed relevance, and Global)."""
    import vr_runtime.reconstruct as rec
    calls, packed = [], []
    real_pp, real_batch = rec.pool_pack, rec.reconstruct_embeds_batch

    def counting(*a, **k):
        calls.append(a[0].shape[0])
        return real_pp(*a, **k)

    def keep(*a, **k):
        out = real_batch(*a, **k)
        packed.append((out[0].clone(), list(out[1])))
        return out
    g = torch.Generator().manual_seed(11)
    videos = [torch.randn(T, 3, 448, 448, generator=g) for T in (4, 2, 3)]
    opts = [dict(policy="fragment", relevant=[True, False, False, True]),
            dict(policy="global"), dict(policy="uniform")]
    kw = dict(max_new_tokens=5, budget=300)
    alone = [vr.prepare(vr.request(v, q, num_frames=v.shape[0], **kw, **o))
             for v, q, o in zip(videos, QUESTIONS, opts)]
    texts = [vr.answer(v, q, num_frames=v.shape[0], **kw, **o).text
             for v, q, o in zip(videos, QUESTIONS, opts)]
    monkeypatch.setattr(rec, "pool_pack", counting)
    import vr_runtime.runtime.batch as rt
    monkeypatch.setattr(rt, "reconstruct_embeds_batch", keep)
    got = vr.answer_batch(videos, QUESTIONS, [dict(num_frames=v.shape[0], **kw, **o)
                                              for v, o in zip(videos, opts)])
    from vr_runtime.planning.policies import kept_frames
    assert calls == [sum(len(kept_frames(p.fitted.plan, vr.lm.grid)) for p in alone)]
    assert [a.text for a in got] == texts
    (x, lengths), = packed
    assert lengths == [p.embeds.shape[1] for p in alone]
    for b, p in enumerate(alone):
        assert torch.equal(x[b, :lengths[b]], p.embeds[0])
        assert not x[b, lengths[b]:].any()


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tiny", "tiny-qwen2.5-vl"])
def test_one_pool_pack_for_the_batch_cuda(name):
    """CUDA, the Triton kernel (bench/gpu_run.sh, stage tests): the batch's one pool_pack
    gives each request's own rows bit for bit, and the one-by-one tokens."""
    from vr_runtime.backbones import load_backbone
    torch.manual_seed(0)
    v = VideoRouter(load_backbone(name, device="cuda", dtype=torch.bfloat16), warmup_frames=0)
    g = torch.Generator().manual_seed(11)
    videos = [torch.randn(T, 3, 448, 448, generator=g) for T in (4, 2, 3)]
    opts = [dict(policy="fragment", relevant=[True, False, False, True]),
            dict(policy="global"), dict(policy="uniform")]
    kw = dict(max_new_tokens=5, budget=300)
    alone = [v.prepare(v.request(x, q, num_frames=x.shape[0], **kw, **o))
             for x, q, o in zip(videos, QUESTIONS, opts)]
    done = [v.prepare(v.request(x, q, num_frames=x.shape[0], **kw, **o), pack=False)
            for x, q, o in zip(videos, QUESTIONS, opts)]
    from vr_runtime.runtime.batch import pack_batch
    x, lengths = pack_batch(v.lm, done)
    for b, p in enumerate(alone):
        assert torch.equal(x[b, :lengths[b]], p.embeds[0])
    texts = [v.answer(x_, q, num_frames=x_.shape[0], **kw, **o).text
             for x_, q, o in zip(videos, QUESTIONS, opts)]
    got = v.answer_batch(videos, QUESTIONS, [dict(num_frames=x_.shape[0], **kw, **o)
                                             for x_, o in zip(videos, opts)])
    assert [a.text for a in got] == texts


def test_batched_answers_do_not_correct_the_latency_model(vr, monkeypatch):
    """ttft_budget_s: a batch's shared prefill time must not be observed as one request's."""
    from types import SimpleNamespace
    observed = []
    fake = SimpleNamespace(raw=lambda **kw: {}, predict=lambda **kw: {"prefill": 1e-3},
                           observe=lambda raw, times: observed.append(times),
                           device=SimpleNamespace(name="fake"))
    monkeypatch.setattr(vr.latency, "model", fake)   # VideoRouter.latency: its built model
    v = torch.randn(2, 3, 448, 448, generator=torch.Generator().manual_seed(4))
    kw = dict(num_frames=2, max_new_tokens=2, policy="uniform", ttft_budget_s=5.0)
    vr.answer(v, QUESTIONS[0], **kw)
    assert len(observed) == 1
    res = vr.answer_batch([v, v[:1]], QUESTIONS[:2], **kw)
    assert len(observed) == 1 and all(r.report["ttft_predicted_s"] for r in res)
    vr.answer_batch([v, v[:1]], QUESTIONS[:2], batch_prefill=False, **kw)
    assert len(observed) == 3


def test_static_cache_is_reused_while_it_fits(vr, prompts):
    dec = GreedyDecoder(vr.lm, "static", bucket=64)
    dec.generate([prompts[0].embeds], [3], [prompts[0].position_ids], set())
    cache, key = dec._cache, dec._cache_key
    assert key[0] == 1 and key[1] % 64 == 0 and key[1] >= prompts[0].embeds.shape[1] + 3
    keys = cache.layers[0].keys
    dec.generate([prompts[2].embeds], [3], [prompts[2].position_ids], set())   # shorter: reused
    assert dec._cache is cache and cache.layers[0].keys is keys
    dec.generate([prompts[1].embeds], [64], [prompts[1].position_ids], set())  # longer: new one
    assert dec._cache is not cache and dec._cache_key[1] > key[1]
    dec.release()
    assert dec._cache is None


def test_graph_failure_falls_back_to_static(vr, prompts, monkeypatch):
    """A capture error (simulated: the compiled step raises) redoes the request with the static
    cache eagerly, says why, and stays there."""
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: None)  # CPU
    want = [reference(vr.lm, p.embeds, p.position_ids, 4)[0] for p in prompts[:2]]
    dec = GreedyDecoder(vr.lm, "static", bucket=64)
    dec.mode = "graph"   # CPU: pretend; the step below stands in for a failing torch.compile

    def broken(*a, **k):
        raise RuntimeError("backend compiler failed\nstack")
    dec._step_fn = lambda: broken if dec.mode == "graph" else GreedyDecoder._step_fn(dec)
    with pytest.warns(RuntimeWarning, match="CUDA-graph decoding failed"):
        got = dec.generate([p.embeds for p in prompts[:2]], [4, 4],
                           [p.position_ids for p in prompts[:2]], set())
    assert got == want and dec.mode == "static"
    assert dec.fallback.startswith("CUDA-graph decoding failed (RuntimeError: backend compiler")


def test_compiled_decoding_equals_the_reference(tiny_vr):
    """The static path's step compiled by inductor (CPU, fp32): the reference's tokens, for
    each prompt and for the batch; compiled once at load (warm_up) for a cache every later
    request fits, so no request compiles again. One family (each compile costs tens of seconds
    on 2 cores): the step compiled is the static path's, whose M-RoPE rows the eager tests
    above check on Qwen2.5-VL."""
    vr, prompts = tiny_vr, make_prompts(tiny_vr)
    dec = GreedyDecoder(vr.lm, "compiled", bucket=256)
    info = dec.warm_up(slots=512)
    assert info["mode"] == "compiled" and info["slots"] == 512 and info["seconds"] > 0
    step, key = dec._step, dec._cache_key
    for p, n in zip(prompts, (2, 5, 7)):
        want, _ = reference(vr.lm, p.embeds, p.position_ids, n)
        assert dec.generate([p.embeds], [n], [p.position_ids], set())[0] == want
        assert dec._step is step and dec._cache_key == key   # the warmed cache and step, reused
    limits = [5, 2, 4]
    want = [reference(vr.lm, p.embeds, p.position_ids, n)[0] for p, n in zip(prompts, limits)]
    got = dec.generate([p.embeds for p in prompts], limits, [p.position_ids for p in prompts],
                       set())
    assert got == want


def test_warm_up_compiles_nothing_in_eager_modes(vr):
    assert GreedyDecoder(vr.lm, "static").warm_up() == {"mode": "static", "seconds": 0.0}
    with pytest.raises(ValueError, match="slots: expected an int > 11"):
        GreedyDecoder(vr.lm, "compiled").warm_up(slots=4)


def test_compile_cache(tmp_path, monkeypatch):
    from vr_runtime.generate import use_compile_cache
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    assert use_compile_cache(tmp_path / "c") == tmp_path / "c" / "inductor"
    import os
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "c" / "triton")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert use_compile_cache(tmp_path / "d") == tmp_path / "d" / "inductor"   # asked for: used
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert use_compile_cache() == tmp_path / "mine"          # the user's, without a path: kept
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())   # inductor's own
    assert use_compile_cache() == tmp_path / "home" / ".cache" / "videorouter" / "compile" / \
        "inductor"
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="compile cache .*: cannot create it"):
        use_compile_cache(tmp_path / "file" / "sub")


def test_decoding_option():
    assert resolve_decoding("auto", torch.device("cpu")) == "dynamic"
    assert resolve_decoding("compiled", torch.device("cpu")) == "compiled"
    assert resolve_decoding("auto", torch.device("cuda")) == "dynamic"   # graph: opt-in
    assert resolve_decoding("static", torch.device("cpu")) == "static"
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        resolve_decoding("graph", torch.device("cpu"))
    with pytest.raises(ValueError, match="decoding: expected one of"):
        resolve_decoding("fast", torch.device("cpu"))


def test_answer_warns_nothing_from_the_library(vr, monkeypatch):
    """Issue 22 item 4: no FutureWarning/DeprecationWarning (transformers' past_key_values
    rename) and no deprecation line from transformers' logger, in prefill and decoding."""
    from transformers.utils import logging as hf_logging
    logged = []
    for name in ("transformers.utils.generic", "transformers.utils.deprecation"):
        monkeypatch.setattr(hf_logging.get_logger(name), "warning_once",
                            lambda msg, *a, **k: logged.append(msg), raising=False)
        monkeypatch.setattr(hf_logging.get_logger(name), "warning",
                            lambda msg, *a, **k: logged.append(msg), raising=False)
    v = torch.randn(3, 3, 448, 448, generator=torch.Generator().manual_seed(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        for mode in ("dynamic", "static"):
            vr.greedy = GreedyDecoder(vr.lm, mode, bucket=64)
            vr.answer(v, QUESTIONS[0], num_frames=3, max_new_tokens=3, policy="uniform",
                      budget=300)
            vr.answer_batch([v, v[:2]], QUESTIONS[:2], num_frames=3, max_new_tokens=3,
                            policy="uniform", budget=300)
    vr.greedy = GreedyDecoder(vr.lm, "dynamic")
    assert not [m for m in logged if "deprecated" in str(m)]


def test_cache_helpers_follow_the_installed_names():
    from dataclasses import dataclass

    from vr_runtime.backbones.base import cache_kwargs

    class New(torch.nn.Module):
        def forward(self, input_ids=None, cache=None):
            ...

    class Old(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None):
            ...

    @dataclass
    class OutNew:
        cache: object = None

    @dataclass
    class OutOld:
        past_key_values: object = None

    assert cache_kwargs(New(), "c") == {"cache": "c"}
    assert cache_kwargs(Old(), "c") == {"past_key_values": "c"}
    assert cache_kwargs(New(), None) == {}
    assert output_cache(OutNew("c")) == "c" and output_cache(OutOld("c")) == "c"


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tiny", "tiny-qwen2.5-vl"])
def test_graph_decoding_equals_eager_cuda(name):
    """CUDA graphs over the static cache (opt-in on CUDA) give the eager dynamic-cache
    tokens, for one request, a repeated request (graph replay on reused buffers) and a batch."""
    from vr_runtime.backbones import load_backbone
    torch.manual_seed(0)
    vr = VideoRouter(load_backbone(name, device="cuda", dtype=torch.float32), warmup_frames=0,
                     decoding="graph")
    assert vr.greedy.mode == "graph"
    g = torch.Generator().manual_seed(5)
    ps = [vr.prepare(vr.request(torch.randn(T, 3, 448, 448, generator=g), q, num_frames=T,
                                 max_new_tokens=8, policy="uniform", budget=b))
          for T, q, b in zip((3, 4, 2), QUESTIONS, (300, 420, 200))]
    eager = GreedyDecoder(vr.lm, "dynamic")
    want = [eager.generate([p.embeds], [12], [p.position_ids], set())[0] for p in ps]
    for _ in range(2):
        got = [vr.greedy.generate([p.embeds], [12], [p.position_ids], set())[0] for p in ps]
        assert got == want
    got = vr.greedy.generate([p.embeds for p in ps], [12] * 3, [p.position_ids for p in ps], set())
    assert got == want


def test_public_prefill_decode_one_token_and_generate(vr, prompts):
    """generate.py's functions (as gpt-fast's): ``prefill`` gives the first token and the cache,
    ``decode_one_token`` the next ones, ``generate`` the whole answer -- the reference's ids."""
    from vr_runtime.generate import decode_one_token, generate, prefill
    lm = vr.lm
    for p in prompts:
        want, _ = reference(lm, p.embeds, p.position_ids, 6)
        with torch.inference_mode():
            assert generate(lm, p.embeds, 6, position_ids=p.position_ids,
                            mode="static") == want
            nxt, cache = prefill(lm, p.embeds, p.position_ids)
            pos = torch.tensor([[lm.next_position(p.position_ids, p.embeds.shape[1])]])
            step = lm.step_position_ids(0)
            if step is not None:
                pos = pos.expand(*step.shape[:-2], 1, 1).contiguous()
            got = [int(nxt)]
            for _ in range(len(want) - 1):
                nxt = decode_one_token(lm, nxt.view(1, 1), cache, pos, None)
                pos = pos + 1
                got.append(int(nxt))
        assert got == want
