"""The Image Router at fixed shapes (routing.compiled.RouterRunner): frames padded to a fixed
chunk and the question to a bucket give the eager path's frame logits, eagerly and compiled
(inductor, fp32 on CPU), with 1-D positions (InternVL3), M-RoPE (Qwen2.5-VL) and DeepStack
streams (Qwen3-VL), at the paper's input and at router_pool 2."""
import pytest
import torch

from vr_runtime.backbones import load_backbone
from vr_runtime.routing.compiled import QUESTION_BUCKET, RouterRunner
from vr_runtime.routing.routers import RouterConfig, Routers, embed_question, pooled_grid


def rel_err(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def make(name, pool=1):
    lm = load_backbone(name)
    r = Routers.from_backbone(lm, RouterConfig(num_layers=2, router_pool=pool), seed=3)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():   # random heads: logits that differ between frames
        for p in r.image.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return lm, r


def z_and_q(lm, T, question, seed):
    H, W = lm.grid
    g = torch.Generator().manual_seed(seed)
    Z = torch.randn(T, H * W, lm.hidden_size * lm.streams, generator=g)
    return Z, embed_question(lm.model, lm.tokenizer, question)


def eager_and_runner(lm, r, runner, Z, qe):
    """(eager frame logits, the runner's) of the same frames and question."""
    with torch.inference_mode():
        r.runner = None
        ref = r.frame_logits(Z, qe, grid=lm.grid)
        r.runner = runner
        return ref, r.frame_logits(Z, qe, grid=lm.grid)


def runner_for(lm, r, chunk, mode):
    tg = pooled_grid(lm.grid, r.config.router_pool)
    return RouterRunner(r, tg[0] * tg[1], chunk, mode)


QUESTIONS = ("What shape is the red object?",
             "Which colour is the small square that appears after the circle leaves?")


@pytest.mark.parametrize("name,pool", [("tiny", 1), ("tiny", 2), ("tiny-qwen2.5-vl", 1),
                                       ("tiny-qwen3-vl", 1)])
def test_fixed_shapes_equal_eager(name, pool):
    lm, r = make(name, pool)
    for seed, (T, q) in enumerate(((7, QUESTIONS[0]), (3, QUESTIONS[1]))):
        Z, qe = z_and_q(lm, T, q, seed)
        assert qe.shape[0] % QUESTION_BUCKET   # the question is padded
        ref, got = eager_and_runner(lm, r, runner_for(lm, r, 3, "off"), Z, qe)
        assert got.shape == (T,)
        assert rel_err(got, ref) < 1e-5, (name, pool, T)
        assert float(ref.std()) > 1e-4


@pytest.mark.parametrize("name", ["tiny"])   # the other families' shapes: the eager test above
def test_compiled_equals_eager(name):
    lm, r = make(name)
    runner = runner_for(lm, r, 2, "inductor")
    tg = pooled_grid(lm.grid, 1)
    assert runner.warm_up(tg, lm.hidden_size * lm.streams)["seconds"] > 0
    for seed, T in ((11, 5), (12, 2)):
        Z, qe = z_and_q(lm, T, QUESTIONS[0], seed)
        ref, got = eager_and_runner(lm, r, runner, Z, qe)
        assert rel_err(got, ref) < 1e-5, (name, T)


def test_runner_is_skipped_for_another_pool_or_an_explicit_batch():
    lm, r = make("tiny")
    Z, qe = z_and_q(lm, 4, QUESTIONS[0], 0)
    calls = []
    runner = runner_for(lm, r, 3, "off")
    orig = runner.logits
    runner.logits = lambda *a: calls.append(1) or orig(*a)
    r.runner = runner
    with torch.inference_mode():
        r.frame_logits(Z, qe, grid=lm.grid)
        r.frame_logits(Z, qe, router_pool=2, grid=lm.grid)     # another token count: eager
        r.frame_logits(Z, qe, frame_batch=2, grid=lm.grid)     # asked for: eager
    assert calls == [1]


def test_bad_chunk():
    lm, r = make("tiny")
    with pytest.raises(ValueError, match="router_chunk: expected an int >= 1"):
        runner_for(lm, r, -1, "off")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tiny", "tiny-qwen3-vl"])
def test_cudagraphs_equal_eager_cuda(name):
    torch.backends.cuda.matmul.allow_tf32 = False
    lm, r = make(name)
    lm = load_backbone(name, device="cuda", dtype=torch.float32)
    r = r.to_model(lm.device, lm.dtype)
    r.positions = lm.router_position_ids
    runner = runner_for(lm, r, 3, "cudagraphs")
    runner.warm_up(pooled_grid(lm.grid, 1), lm.hidden_size * lm.streams)
    for seed, T in ((1, 7), (2, 2)):
        Z, qe = z_and_q(lm, T, QUESTIONS[seed - 1], seed)
        ref, got = eager_and_runner(lm, r, runner, Z.cuda(), qe)
        assert rel_err(got, ref) < 1e-4, (name, T)
