"""Route supervision (vr_tiny/route.py) and its use in Stage 3 (``route_weight``): the cue is the
question's color word, each turn's pair is the row that predicts its answer and that word's row
in its own question, and Stage 3's route loss is -log of the head's own attention weight (the
eager implementation's, as a plain reference)."""
import pytest
import torch

from vr_runtime.training.config import ConfigError
from vr_tiny.route import (FrameSupervision, Laid, answer_pairs, answer_rows,
                                         cue_word, evidence_rows, turn_labels)
from vr_runtime.training.stages import dialogue_sequence
from tiny_helpers import projector_features, stage3_trainee, tiny_config

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


# the frames each labelled question is about: the red one's is 1, the blue and green one's 2,
# the absent cyan one's none (the background question has no labels)
SIBLING_FRAMES = {TURNS[2][0]: [], TURNS[3][0]: [2]}


def _step(lm, v, sibling_labels=False, **over):
    """One Stage 3 step on a dense dialogue of ``TURNS`` (the first turn's frame 1 labelled;
    with ``sibling_labels`` the later turns' too) -> (trainee, outputs, example)."""
    tr = stage3_trainee(lm, dense_plan_prob=1.0, dense_plan_dialogue=True,
                        pool_pack_backend="torch", **over)
    mark = lambda fs: torch.tensor([float(t in fs) for t in range(v.shape[0])])  # noqa: E731
    q = torch.tensor(tr.tokenizer(TURNS[0][0], add_special_tokens=False)["input_ids"])
    sib = [{"question": q_, "answer": a,
            **({"labels": mark(SIBLING_FRAMES[q_])}
               if sibling_labels and q_ in SIBLING_FRAMES else {})} for q_, a in TURNS[1:]]
    ex = {"policy": 1, "question": TURNS[0][0], "answer": TURNS[0][1], "v": v, "q_ids": q,
          "times": None, "turns": sib, "labels": mark([1])}
    torch.manual_seed(5)           # the dialogue's turn order
    return tr, tr.stage3([ex]), ex


def _eager_lm_and_features(T: int, seed: int):
    from vr_runtime.backbones.internvl3 import InternVL3Backbone
    lm = InternVL3Backbone.tiny(attn_implementation="eager")
    return lm, projector_features(lm.model, T, seed=seed)


def test_stage3_route_loss_is_the_heads_attention_weight(monkeypatch):
    from vr_tiny import curriculum
    T = 3
    lm, v = _eager_lm_and_features(T, 3)
    _, off, _ = _step(lm, v)
    assert "l_route" not in off
    seen = []
    real = curriculum.dialogue_turns
    monkeypatch.setattr(curriculum, "dialogue_turns", lambda *a: seen.append(real(*a)) or seen[-1])
    tr, on, _ = _step(lm, v, route_weight=0.5, route_layer=2, route_head=3)
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
        tiny_config("tiny_stage3", route_weight=-1.0).validate()
    with pytest.raises(ValueError, match="route_layer, route_head"):
        stage3_trainee(tiny_lm, route_weight=1.0, route_layer=4)
    stage3_trainee(tiny_lm, route_weight=0.0, route_layer=9)      # off: never looked at


def test_evidence_rows_are_the_kept_relevant_frames_rows():
    plan, counts, dest = [1, 0, 4, 1, 2], [4, 0, 1, 4, 2], [10, 0, 16, 19, 25]
    assert evidence_rows(plan, counts, dest, [1, 1, 1, 0, 1]) == [10, 11, 12, 13, 16, 25, 26]
    assert evidence_rows(plan, counts, dest, [0] * 5) == []        # absent: nothing to read
    assert evidence_rows(plan, counts, dest, None) == []
    with pytest.raises(ValueError, match="one per frame"):
        evidence_rows(plan, counts, dest, [1, 0])


def test_turn_labels_follow_each_turns_question_and_the_stretch():
    ex = {"labels": torch.tensor([0., 1., 0.]), "turns": [
        {"question": TURNS[2][0], "labels": torch.tensor([0., 0., 0.])},
        {"question": TURNS[1][0]}]}
    turns = [TURNS[0], TURNS[2], TURNS[1]]
    assert turn_labels(turns, ex) == [[0., 1., 0.], [0., 0., 0.], None]
    assert turn_labels(turns[:1], ex, src=[0, 0, 1, 1, 2]) == [[0., 0., 1., 1., 0.]]


def test_stage3_evidence_and_exclusion_losses_are_the_heads_attention(monkeypatch):
    from vr_tiny import curriculum
    T = 3
    lm, v = _eager_lm_and_features(T, 4)
    _, off, _ = _step(lm, v, sibling_labels=True)
    assert "l_evidence" not in off
    seen = []
    real = curriculum.dialogue_turns
    monkeypatch.setattr(curriculum, "dialogue_turns", lambda *a: seen.append(real(*a)) or seen[-1])
    tr, on, ex = _step(lm, v, sibling_labels=True, evidence_weight=0.5, evidence_layer=3,
                       evidence_head=1, route_weight=0.25, exclusion_weight=2.0,
                       exclusion_layers=[1, 3])
    torch.testing.assert_close(on["l_lm"], off["l_lm"])
    turns = seen[0]
    ids, n_prompt, dest, pos, target = dialogue_sequence(lm, turns, [1] * T)
    emb = tr.pack(tr.project(v), [1] * T, tr.grid, tr.embed(torch.tensor(ids)), dest)
    with torch.no_grad():
        atts = lm.decoder()(inputs_embeds=emb[None], output_attentions=True,
                            return_dict=True).attentions
    n = tr.grid[0] * tr.grid[1]
    mass = lambda a, r, fs: sum(a[..., r, dest[t]:dest[t] + n].sum(-1) for t in fs)  # noqa
    want, excl = [], []
    for r, lab in zip(answer_rows(n_prompt, target), turn_labels(turns, ex)):
        frames = [t for t in range(T) if lab and lab[t]]
        if frames:      # the background and the absent color's turns have no evidence
            want.append(-mass(atts[3][0, 1], r, frames).log())
            others = [t for t in range(T) if t not in frames]
            excl += [-torch.log1p(-mass(atts[i][0], r, others)) for i in (1, 3)]   # [H] each
    assert len(want) == 2
    torch.testing.assert_close(on["l_evidence"], torch.stack(want).mean(), atol=1e-4,
                               rtol=1e-4)
    torch.testing.assert_close(on["l_exclusion"], torch.cat(excl).mean(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(on["loss"], off["loss"] + 0.5 * on["l_evidence"]
                               + 0.25 * on["l_route"] + 2.0 * on["l_exclusion"], atol=1e-5,
                               rtol=1e-5)
    on["loss"].backward()
    assert lm.decoder().layers[3].self_attn.q_proj.weight.grad.abs().sum() > 0


def test_evidence_settings_fail_in_one_line(tiny_lm):
    with pytest.raises(ConfigError, match="evidence_weight"):
        tiny_config("tiny_stage3", evidence_head=-1).validate()
    with pytest.raises(ValueError, match="evidence_layer, evidence_head"):
        stage3_trainee(tiny_lm, evidence_weight=1.0, evidence_head=4)
    stage3_trainee(tiny_lm, evidence_weight=0.0, evidence_layer=9)
    with pytest.raises(ConfigError, match="exclusion_weight"):
        tiny_config("tiny_stage3", exclusion_layers=[2, -1]).validate()
    with pytest.raises(ConfigError, match="exclusion_weight"):
        tiny_config("tiny_stage3", exclusion_weight=1.0, exclusion_layers=[]).validate()
    with pytest.raises(ValueError, match="exclusion_layers: expected < 4 layers"):
        stage3_trainee(tiny_lm, exclusion_weight=1.0, exclusion_layers=[2, 4])


def test_frame_pairs_are_visual_rows_and_their_own_frames_first_row():
    visual = [10, 11, 12, 13, 16, 25, 26, 27]          # frames: 10-13, 16 (one row), 25-27
    laid = Laid(None, [], 0, [], [], None, visual)
    want = [(11, 10), (12, 10), (13, 10), (26, 25), (27, 25)]
    assert FrameSupervision(rows=99).pairs(laid) == want
    torch.manual_seed(0)
    drawn = FrameSupervision(rows=3).pairs(laid)
    assert len(drawn) == 3 and set(drawn) <= set(want)
    assert FrameSupervision().pairs(Laid(None, [], 0, [], [], None, [])) == []


def test_stage3_frame_loss_is_the_kl_from_uniform_over_the_frame_so_far():
    T = 2
    lm, v = _eager_lm_and_features(T, 6)
    _, off, _ = _step(lm, v)
    assert "l_frame" not in off
    tr, on, _ = _step(lm, v, frame_weight=0.7, frame_layer=1, frame_head=2, frame_rows=10 ** 6)
    torch.testing.assert_close(on["l_lm"], off["l_lm"])
    torch.manual_seed(5)
    turns = [TURNS[0]]        # the frame loss does not depend on the turns' order: only one
    ids, n_prompt, dest, pos, target = dialogue_sequence(lm, turns, [1] * T)
    emb = tr.pack(tr.project(v), [1] * T, tr.grid, tr.embed(torch.tensor(ids)), dest)
    with torch.no_grad():
        att = lm.decoder()(inputs_embeds=emb[None], output_attentions=True,
                           return_dict=True).attentions[1][0, 2]
    n = tr.grid[0] * tr.grid[1]
    kl = [-att[r, d:r + 1].log().mean() - torch.log(torch.tensor(r + 1.0 - d))
          for d in dest for r in range(d + 1, d + n)]
    torch.testing.assert_close(on["l_frame"], torch.stack(kl).mean(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(on["loss"], off["loss"] + 0.7 * on["l_frame"], atol=1e-5,
                               rtol=1e-5)
    on["loss"].backward()
    assert lm.decoder().layers[1].self_attn.q_proj.weight.grad.abs().sum() > 0


def test_frame_settings_fail_in_one_line(tiny_lm):
    with pytest.raises(ConfigError, match="frame_weight, frame_layer"):
        tiny_config("tiny_stage3", frame_rows=0).validate()
    with pytest.raises(ValueError, match="frame_layer, frame_head"):
        stage3_trainee(tiny_lm, frame_weight=1.0, frame_head=4)
