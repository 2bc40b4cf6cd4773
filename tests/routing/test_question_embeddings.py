"""Emb(q) is computed once an answer: the Semantic Router (policy 'auto') and the Image Router
(the scorer) read the same question embeddings."""
import torch

from vr_runtime.runtime import pipeline as rt
from vr_runtime.cli import SAMPLE_VIDEO


def test_one_embedding_an_answer_and_a_new_one_for_a_new_question(monkeypatch):
    tiny_vr = rt.VideoRouter.from_pretrained("tiny")   # the shipped, trained routers
    calls = []
    real = rt.embed_question

    def counting(model, tokenizer, question):
        calls.append(question)
        return real(model, tokenizer, question)
    monkeypatch.setattr(rt, "embed_question", counting)
    kw = dict(num_frames=4, max_length=1400, max_new_tokens=2, policy="auto")
    first = tiny_vr.answer(str(SAMPLE_VIDEO), "What shape is the red object?", **kw)
    assert first.report["policy"] == "fragment" and calls == ["What shape is the red object?"]
    again = tiny_vr.answer(str(SAMPLE_VIDEO), "What shape is the red object?", **kw)
    assert len(calls) == 1 and again.text == first.text
    tiny_vr.answer(str(SAMPLE_VIDEO), "What shape is the blue object?", **kw)
    assert calls == ["What shape is the red object?", "What shape is the blue object?"]
    # the kept tensor is the one a fresh computation gives
    assert torch.equal(tiny_vr.question_embeddings("What shape is the blue object?"),
                       real(tiny_vr.lm.model, tiny_vr.lm.tokenizer,
                            "What shape is the blue object?"))
