"""eval.option_scoring.option_logprobs (the scoring seam of the label tools)
against a plain reference:
one direct backbone forward over prompt + continuation per (plan, continuation), on random
frames, odd frame counts, plans that keep, pool and drop frames, both backbone families."""
import random

import pytest
import torch

from vr_kernels import pooled_counts
from vr_runtime.eval.option_scoring import option_logprobs


@pytest.fixture(scope="module", params=["tiny", "tiny-qwen2.5-vl"])
def vr(request):
    from vr_runtime import VideoRouter
    torch.manual_seed(0)
    return VideoRouter.from_pretrained(request.param, dtype=torch.float32, warmup_frames=0)


@torch.no_grad()
def reference(vr, Z, prompt, plan, cont):
    lm = vr.lm
    counts = pooled_counts(plan, lm.grid)
    ids, starts = lm.build_prompt(prompt, counts)
    full = torch.cat([ids, torch.tensor(cont, dtype=torch.long)])
    keep = [t for t, c in enumerate(counts) if c]
    kept_plan = [plan[t] for t in keep]
    if keep:
        from vr_runtime.reconstruct import reconstruct_embeds
        emb = reconstruct_embeds(lm.model, full, Z[keep], kept_plan, lm.image_token_id, lm.grid,
                                 frame_starts=starts)
    else:
        emb = lm.embed_tokens(full)[None]
    pos = lm.position_ids(full, kept_plan, starts)
    kw = {} if pos is None else {"position_ids": pos}
    logits = lm.model(inputs_embeds=emb, use_cache=False, return_dict=True, **kw).logits[0]
    lp = torch.log_softmax(logits.float(), -1)
    L = ids.numel()
    return float(sum(lp[L - 1 + j, t] for j, t in enumerate(cont)).detach())


@torch.no_grad()
@pytest.mark.parametrize("T", [3, 5])
def test_option_logprobs_match_a_plain_forward(vr, T):
    rng = random.Random(T)
    g = torch.Generator().manual_seed(T)
    H, W = vr.lm.frame_spec.size
    Z = vr.lm.encode_frames(torch.randn(T, 3, H, W, generator=g))
    tok = vr.lm.tokenizer
    conts = [tok.encode("A", add_special_tokens=False),
             tok.encode(" circle", add_special_tokens=False) + [tok.eos_token_id or 0],
             tok.encode("square triangle", add_special_tokens=False)]
    windows = [0, 1, 2, 4, 8, (2, 4)]
    plans = [[rng.choice(windows) for _ in range(T)] for _ in range(2)]
    plans += [[1] * T, [0] * T, [8] * T]
    # plans of equal prompt length are batched: leave-one-out plans share one pass
    plans += [[8 if u == t else 1 for u in range(T)] for t in (0, T - 1)]
    got = option_logprobs(vr.lm, Z, "What shape is the red object?", plans, conts, batch_size=3)
    assert got.shape == (len(plans), len(conts))
    for i, plan in enumerate(plans):
        for j, c in enumerate(conts):
            ref = reference(vr, Z, "What shape is the red object?", plan, c)
            assert got[i, j].item() == pytest.approx(ref, rel=1e-4, abs=1e-3), (plan, j)
    # one-token continuations only: read off the prefill
    one = option_logprobs(vr.lm, Z, "What shape is the red object?", plans[:4], conts[:1])
    assert torch.allclose(one[:, 0], got[:4, 0], atol=1e-4)


def test_option_logprobs_checks_arguments(vr):
    Z = torch.zeros(2, vr.lm.grid[0] * vr.lm.grid[1], vr.lm.hidden_size)
    with pytest.raises(ValueError, match="plans\\[0\\]"):
        option_logprobs(vr.lm, Z, "q?", [[1, 1, 1]], [[5]])
    with pytest.raises(ValueError, match="continuations"):
        option_logprobs(vr.lm, Z, "q?", [[1, 1]], [[]])
    with pytest.raises(ValueError, match="batch_size"):
        option_logprobs(vr.lm, Z, "q?", [[1, 1]], [[5]], batch_size=0)
