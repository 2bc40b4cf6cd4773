"""The InternVL video prompt: placeholder counts match the plan for every policy, the fast
expansion equals tokenising the full text, and reconstruction writes only the placeholders."""
import random
import re

import pytest
import torch

from vr_kernels import pooled_counts
from vr_kernels.reference import pool_pack_reference
from vr_runtime.planning import budget as B
from vr_runtime.backbones.prompt import IMG_CONTEXT, build_video_prompt, text_tokens
from vr_runtime.reconstruct import reconstruct_embeds

Q = "Which color is the triangle that appears after the red circle?"


def _plans(T, budget, rng):
    rel = [rng.random() < 0.3 for _ in range(T)]
    return {
        "dense": B.plan_dense(T),
        "budget": B.plan_budget(T, budget),
        "uniform": B.plan_uniform(T, budget),
        "global": B.plan_global(T, budget),
        "fragment": B.plan_fragment(rel, budget),
        "fragment_none": B.plan_fragment([False] * T, budget),
        "fragment_all": B.plan_fragment([True] * T, budget),
    }


@pytest.mark.parametrize("seed", [0, 1])
def test_placeholder_counts_match_plan_every_policy(tiny_lm, seed):
    tok, img = tiny_lm.tokenizer, tiny_lm.image_token_id
    rng = random.Random(seed)
    T = rng.choice([5, 16, 33])
    n_text = text_tokens(tok, Q, T)
    budget = B.visual_budget(rng.choice([1500, 3000, 12288]), n_text, 16)
    for name, plan in _plans(T, budget, rng).items():
        counts = pooled_counts(plan)
        ids, starts = build_video_prompt(tok, Q, counts, img)
        kept = [t for t in range(T) if counts[t]]
        assert int((ids == img).sum()) == sum(counts), name
        assert len(starts) == len(kept), name
        for s, t in zip(starts, kept):  # each kept frame: a contiguous run framed by <img> </img>
            c = counts[t]
            assert (ids[s:s + c] == img).all(), name
            assert ids[s - 1] == tok.convert_tokens_to_ids("<img>"), name
            assert ids[s + c] == tok.convert_tokens_to_ids("</img>"), name
        text = tok.decode(ids[ids != img].tolist(), skip_special_tokens=False)
        labels = [int(m) - 1 for m in re.findall(r"Frame(\d+): <img></img>", text)]
        assert labels == kept, name  # numbering = sampled index, dropped frames have no line
        assert len(ids) - sum(counts) <= n_text, name  # L_text is an upper bound for every plan
        if name != "dense":
            assert sum(counts) <= budget, name
        else:
            assert len(ids) - sum(counts) == n_text


def test_fast_expansion_equals_full_tokenisation(tiny_lm):
    tok, img = tiny_lm.tokenizer, tiny_lm.image_token_id
    counts = [256, 0, 64, 16, 128, 0, 1]
    ids, _ = build_video_prompt(tok, Q, counts, img)
    body = "\n".join(f"Frame{i + 1}: <img>{IMG_CONTEXT * c}</img>" for i, c in enumerate(counts) if c)
    full = tok.apply_chat_template([{"role": "user", "content": body + "\n" + Q}], tokenize=False,
                                   add_generation_prompt=True)
    ref = tok(full, add_special_tokens=False)["input_ids"]
    assert ids.tolist() == ref
    assert full.startswith("<|im_start|>user\nFrame1: <img>") and full.endswith("<|im_start|>assistant\n")


def test_bad_questions(tiny_lm):
    tok, img = tiny_lm.tokenizer, tiny_lm.image_token_id
    for q in ("", "   "):
        with pytest.raises(ValueError, match="question"):
            build_video_prompt(tok, q, [4], img)
    with pytest.raises(ValueError, match="image token"):
        build_video_prompt(tok, "what is <IMG_CONTEXT>?", [4], img)
    with pytest.raises(ValueError, match="counts"):
        build_video_prompt(tok, Q, [4, -1], img)


def test_reconstruct_writes_only_placeholders(tiny_lm):
    lm = tiny_lm
    g = torch.Generator().manual_seed(11)
    plan = [2, 0, 1, (1, 2), 4]
    Z = torch.randn(len(plan), 256, lm.hidden_size, generator=g)
    counts = pooled_counts(plan)
    ids, starts = build_video_prompt(lm.tokenizer, Q, counts, lm.image_token_id)
    with torch.no_grad():
        got = reconstruct_embeds(lm.model, ids, Z, plan, lm.image_token_id, lm.grid, frame_starts=starts)[0]
        located = reconstruct_embeds(lm.model, ids, Z, plan, lm.image_token_id, lm.grid)[0]
        plain = lm.model.get_input_embeddings()(ids)
    ph = ids == lm.image_token_id
    torch.testing.assert_close(got[ph], pool_pack_reference(Z, plan), rtol=1e-6, atol=1e-6)
    assert torch.equal(got[~ph], plain[~ph])
    assert torch.equal(got, located)
    # A plan that does not match the prompt is a clear error.
    with pytest.raises(ValueError, match="placeholders"):
        reconstruct_embeds(lm.model, ids, Z, [1, 0, 1, (1, 2), 4], lm.image_token_id, lm.grid)
    with pytest.raises(ValueError, match="Z"):
        reconstruct_embeds(lm.model, ids, Z[:3], plan, lm.image_token_id, lm.grid)
