"""Stage 3's held-out answers are decoded by the runtime's decoder (``GreedyDecoder``: one
prefill, then KV-cached steps), and on the shipped tiny model it gives the tokens of the loop
the evaluation ran before: the whole sequence through the decoder again for every new token,
until ``<|im_end|>``."""
import torch

from stage_helpers import stage_config
from vr_runtime.backbones.tiny import ASSETS
from vr_runtime.training import evaluate
from vr_runtime.training.data import read_jsonl
from vr_runtime.training.features import FeatureCache
from vr_runtime.training.loop import build
from vr_runtime.training.stages import answer_sequence


@torch.no_grad()
def no_cache_tokens(trainee, question, v, plan, max_new_tokens=8):
    """The evaluation's former decoding loop, for ``question`` under ``plan``."""
    bb = trainee.bb
    ids, n_prompt, dest, _ = answer_sequence(bb, question, "x", plan)
    ids = ids[:n_prompt]
    kept = [w for w in plan if w]
    starts = [d for w, d in zip(plan, dest) if w]
    end = trainee.tokenizer.convert_tokens_to_ids("<|im_end|>")
    Z, out = trainee.project(v), []
    for _ in range(max_new_tokens):
        ids_t = torch.tensor(ids + out)
        emb = trainee.pack(Z, plan, trainee.grid, trainee.embed(ids_t), dest)
        pos = bb.position_ids(ids_t, kept, starts)
        kw = {} if pos is None else {"position_ids": pos}
        h = bb.decoder()(inputs_embeds=emb[None], use_cache=False, **kw).last_hidden_state
        nxt = int(bb.lm_head()(h[:, -1])[0].argmax())
        if nxt == end:
            break
        out.append(nxt)
    return out


def test_answers_are_the_former_loops_tokens(tiny_data, tiny_lm, tmp_path, monkeypatch):
    cfg = stage_config(3, tiny_data, tmp_path / "out", routers=str(ASSETS / "routers.safetensors"))
    _, _, tr, _ = build(cfg, lm=tiny_lm)
    tr.eval()
    cache = FeatureCache(tiny_lm, 12, str(tmp_path / "cache"))
    decoded = []
    import vr_runtime.generate as decoding   # evaluate decodes through its generate()
    real = decoding.GreedyDecoder

    class Recording(real):
        def generate(self, *a, **kw):
            decoded.append(super().generate(*a, **kw)[0])
            return [decoded[-1]]

    monkeypatch.setattr(decoding, "GreedyDecoder", Recording)
    examples = read_jsonl(tiny_data["conversations"], "conversation")
    for ex in examples:
        v = cache.get(ex.video, ex.frames)
        for max_length in (None, 1400):
            text, plan, _ = evaluate.answer(tr, ex, v, max_length=max_length)
            assert decoded[-1] == no_cache_tokens(tr, ex.question, v, plan), ex.question
            assert text == tr.tokenizer.decode(decoded[-1], skip_special_tokens=True).strip()
    assert len(decoded) == 2 * len(examples) >= 8 and any(decoded)
