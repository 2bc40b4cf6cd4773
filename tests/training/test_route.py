"""Route supervision (training/route.py) and its use in Stage 3 (``route_weight``): the cue is the
question's color word, each turn's pair is the row that predicts its answer and that word's row
in its own question, and Stage 3's route loss is -log of the head's own attention weight (the
eager implementation's, as a plain reference)."""
import pytest
import torch

from vr_runtime.training.config import ConfigError, load_config
from vr_runtime.training.route import answer_pairs, cue_word
from vr_runtime.training.stages import dialogue_sequence
from stage_helpers import stage3_trainee

TURNS = [("What form is the red thing?", "circle"),
         ("What color is the canvas of the video?", "gray"),        # no color word: no pair
         ("Tell me the geometry of the Cyan object.", "none"),
         ("Is the blue one or the green one a square?", "square")]  # the last color named


def test_cue_word_is_the_last_color_named():
    assert [cue_word(q) for q, _ in TURNS] == ["red", None, "cyan", "green"]
    assert cue_word("What shape is the reddish object?") is None    # whole words only


@pytest.mark.parametrize("plan", [[1, 0, 4, 1], [1] * 5, [2]])
def test_pairs_are_each_answers_row_and_its_own_questions_color(tiny_lm, plan):
    ids, n_prompt, dest, _, targets = dialogue_sequence(tiny_lm, TURNS, plan)
    tok = tiny_lm.tokenizer
    pairs = answer_pairs(tok, ids, n_prompt, targets, [q for q, _ in TURNS])
    assert len(pairs) == 3
    starts = [n_prompt - 1 + i for i, y in enumerate(targets)
              if y != -100 and (i == 0 or targets[i - 1] == -100)]
    for (row, cue), k in zip(pairs, (0, 2, 3)):
        assert row == starts[k]                                   # predicts the turn's answer
        assert tok.decode(ids[row + 1:row + 3]).startswith(TURNS[k][1][:3])
        lo = 0 if k == 0 else starts[k - 1] + 1                   # after the previous answer
        assert lo <= cue < row
        assert tok.decode([ids[cue]]).strip().lower() == cue_word(TURNS[k][0])
    assert pairs[0][1] < n_prompt and pairs[1][1] > pairs[0][0]   # each in its own question
    with pytest.raises(ValueError, match="one per answer"):
        answer_pairs(tok, ids, n_prompt, targets, [TURNS[0][0]])


def _step(lm, v, **over):
    tr = stage3_trainee(lm, dense_plan_prob=1.0, dense_plan_dialogue=True,
                        pool_pack_backend="torch", **over)
    T = v.shape[0]
    q = torch.tensor(tr.tokenizer(TURNS[0][0], add_special_tokens=False)["input_ids"])
    sib = [{"question": q_, "answer": a} for q_, a in TURNS[1:]]
    ex = {"policy": 1, "question": TURNS[0][0], "answer": TURNS[0][1], "v": v, "q_ids": q,
          "times": None, "turns": sib, "labels": torch.tensor([float(t == 1) for t in range(T)])}
    torch.manual_seed(5)           # the dialogue's turn order
    return tr, tr.stage3([ex])


def test_stage3_route_loss_is_the_heads_attention_weight(monkeypatch):
    from vr_runtime.backbones.internvl3 import InternVL3Backbone
    from vr_runtime.training import stages
    lm = InternVL3Backbone.tiny(attn_implementation="eager")
    T = 3
    proj = next(m for n, m in lm.model.named_modules() if n.endswith("multi_modal_projector"))
    width = next(m for m in proj.modules() if isinstance(m, torch.nn.Linear)).in_features
    v = torch.randn(T, 256, width, generator=torch.Generator().manual_seed(3))
    tr0, off = _step(lm, v)
    assert "l_route" not in off
    seen = []
    real = stages.dialogue_turns
    monkeypatch.setattr(stages, "dialogue_turns", lambda *a: seen.append(real(*a)) or seen[-1])
    tr, on = _step(lm, v, route_weight=0.5, route_layer=2, route_head=3)
    torch.testing.assert_close(on["l_lm"], off["l_lm"])            # the LM loss is untouched
    turns = seen[0]
    assert len(turns) == 4
    ids, n_prompt, dest, pos, target = dialogue_sequence(lm, turns, [1] * T)
    emb = tr.pack(tr.project(v), [1] * T, tr.grid, tr.embed(torch.tensor(ids)), dest)
    with torch.no_grad():
        att = lm.decoder()(inputs_embeds=emb[None], output_attentions=True,
                           return_dict=True).attentions[2][0, 3]
    pairs = answer_pairs(lm.tokenizer, ids, n_prompt, target, [q for q, _ in turns])
    want = -torch.stack([att[r, c].log() for r, c in pairs]).mean()
    torch.testing.assert_close(on["l_route"], want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(on["loss"], off["loss"] + 0.5 * on["l_route"], atol=1e-5,
                               rtol=1e-5)
    on["loss"].backward()
    attn = lm.decoder().layers[2].self_attn
    assert attn.q_proj.weight.grad.abs().sum() > 0


def test_route_settings_fail_in_one_line(tiny_lm):
    with pytest.raises(ConfigError, match="route_weight"):
        load_config("tiny_stage3", route_weight=-1.0).validate()
    with pytest.raises(ValueError, match="route_layer, route_head"):
        stage3_trainee(tiny_lm, route_weight=1.0, route_layer=4)
    stage3_trainee(tiny_lm, route_weight=0.0, route_layer=9)      # off: never looked at
