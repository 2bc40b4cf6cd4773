"""The router pool reaches every path that runs the Image Router (issue 21 item 1): the default
scorer, the cached one, and FixedRelevance(run_routers=True) -- the benchmark's VideoRouter
rows -- and the report names the pool the Image Router actually ran at."""
import pytest
import torch

from vr_runtime.routing.scorers import FixedRelevance

Q = "What shape is the red object?"


@pytest.fixture
def pools_seen(tiny_vr, monkeypatch):
    """Every router_pool frame_logits / visual_cache receives (None resolved to the config's)."""
    seen = []
    r = tiny_vr.routers
    orig_logits, orig_cache = r.frame_logits, r.visual_cache

    def logits(Z, q, frame_batch=None, router_pool=None, grid=(16, 16)):
        seen.append(r.config.router_pool if router_pool is None else router_pool)
        return orig_logits(Z, q, frame_batch, router_pool, grid)

    def cache(Z, frame_batch=None, router_pool=None, grid=(16, 16)):
        seen.append(r.config.router_pool if router_pool is None else router_pool)
        return orig_cache(Z, frame_batch, router_pool, grid)
    monkeypatch.setattr(r, "frame_logits", logits)
    monkeypatch.setattr(r, "visual_cache", cache)
    return seen


@pytest.mark.parametrize("pool", [2, 4])
def test_fixed_relevance_with_routers_runs_the_pool_asked_for(tiny_vr, frames, pools_seen, pool):
    pattern = [True, False, True]
    rep = tiny_vr.answer(frames(3, seed=31), Q, num_frames=3, max_new_tokens=1,
                         policy="fragment", budget=600,
                         scorer=FixedRelevance(pattern, run_routers=True, router_pool=pool)).report
    assert pools_seen == [pool]
    assert rep["router_pool"] == pool and rep["relevant"] == pattern
    assert any(f"router_pool={pool}" in n for n in rep["notes"])   # the untrained routers use 1


def test_fixed_relevance_default_pool_and_no_routers(tiny_vr, frames, pools_seen):
    kw = dict(num_frames=3, max_new_tokens=1, policy="fragment", budget=600)
    rep = tiny_vr.answer(frames(3, seed=32), Q, scorer=FixedRelevance([True] * 3, run_routers=True),
                         **kw).report
    assert pools_seen == [tiny_vr.routers.config.router_pool]
    assert rep["router_pool"] == tiny_vr.routers.config.router_pool
    rep = tiny_vr.answer(frames(3, seed=32), Q, relevant=[True] * 3, **kw).report
    assert rep["router_pool"] is None and len(pools_seen) == 1   # no Image Router ran


@pytest.mark.parametrize("cache_visual", [False, True])
def test_default_scorers_take_answer_router_pool(tiny_vr, frames, pools_seen, cache_visual):
    rep = tiny_vr.answer(frames(3, seed=33), Q, num_frames=3, max_new_tokens=1,
                         policy="fragment", router_pool=4, cache_visual=cache_visual).report
    assert pools_seen == [4] and rep["router_pool"] == 4
    tiny_vr.clear_visual_cache()


def test_router_pool_with_a_scorer_is_refused(tiny_vr, frames):
    with pytest.raises(ValueError, match="set them on the scorer"):
        tiny_vr.answer(frames(2, seed=34), Q, num_frames=2, policy="fragment", router_pool=2,
                       scorer=FixedRelevance([True, True], run_routers=True))


def test_latency_inputs_use_the_scorers_pool(tiny_vr):
    from vr_runtime.planning.latency import plan_inputs
    from vr_runtime.planning.policies import get_planner
    req = tiny_vr.request(torch.zeros(2, 3, 448, 448), Q, num_frames=2, policy="fragment",
                          scorer=FixedRelevance([True, False], run_routers=True, router_pool=4))
    inputs = plan_inputs(tiny_vr.latency_context, req, get_planner("fragment"), 2)([1, 0])
    assert inputs["router_pool"] == 4 and inputs["routers"] is True
    req = tiny_vr.request(torch.zeros(2, 3, 448, 448), Q, num_frames=2, policy="fragment",
                          relevant=[True, False])
    assert plan_inputs(tiny_vr.latency_context, req, get_planner("fragment"), 2)([1, 0])["routers"] is False

