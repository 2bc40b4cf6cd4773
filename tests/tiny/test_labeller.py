"""The synthetic task's labeller (training/labeller.py): its plans and answers, that what it trains
is exactly what rule (a) scores, its config checks, and a short run end to end."""
from vr_runtime.eval.option_scoring import option_logprobs
import json
import random

import pytest
import torch

from vr_tiny import labeller
from vr_runtime.data import synthetic_videos
from vr_runtime.training.config import ConfigError


def test_drop_plan_covers_every_kept_count():
    rng = random.Random(0)
    T = 16
    kept = [sum(w > 0 for w in labeller.drop_plan(rng, T, (1, 4))) for _ in range(3000)]
    plans = [labeller.drop_plan(rng, T, (1, 4)) for _ in range(200)]
    assert all(len(p) == T and set(p) <= {0, 1, 4} for p in plans)
    assert {1, 4} <= {w for p in plans for w in p}
    # q ~ U(0, 1): every count 0..T is about equally likely (1 / (T + 1) ~ 5.9% each)
    share = [kept.count(k) / len(kept) for k in range(T + 1)]
    assert min(share) > 0.03 and max(share) < 0.09


def test_visible_answer_follows_the_kept_frames():
    q = {"answer": "circle", "frame_labels": [0, 1, 1, 0]}
    assert labeller.visible_answer(q, [1, 0, 0, 1]) == synthetic_videos.ABSENT_ANSWER
    assert labeller.visible_answer(q, [0, 0, 1, 0]) == "circle"
    assert labeller.visible_answer(q, [0, 4, 0, 0]) == "circle"
    absent = {"answer": synthetic_videos.ABSENT_ANSWER, "frame_labels": [0, 0, 0, 0]}
    assert labeller.visible_answer(absent, [1, 1, 1, 1]) == synthetic_videos.ABSENT_ANSWER


def test_fragment_questions_are_targets_and_an_absent_color():
    rng = random.Random(3)
    spec = synthetic_videos.sample_spec(rng, num_frames=16)
    qs = labeller.fragment_questions(spec, rng)
    cats = sorted(q["category"] for q in qs)
    assert cats == ["absent_color", "object_shape", "object_shape"]
    assert all(q["phrasing"] == "train" for q in qs)
    for q in qs:
        rel = [t for t, y in enumerate(q["frame_labels"]) if y]
        assert rel == (spec.frames_with(q["color"]) if q["category"] == "object_shape" else [])


@pytest.mark.parametrize("plan", [[1, 0, 4, 1, 0, 0], [0, 0, 0, 0, 0, 0], [2, 2, 2, 2, 2, 2]])
def test_training_loss_is_what_option_scoring_reads(tiny_lm, plan):
    """-conversation_loss(one turn) == option_logprobs of the same answer under the same plan:
    the labeller is trained on exactly the log-likelihood rule (a) compares."""
    from vr_runtime.training.labels import option_continuations
    torch.manual_seed(0)
    T = len(plan)
    Z = torch.randn(T, 256, tiny_lm.hidden_size)
    q = "What shape is the red object?"
    options = ["circle", "none"]
    conts = option_continuations(tiny_lm.tokenizer, options, "option-text")
    with torch.no_grad():
        lp = option_logprobs(tiny_lm, Z, q, [plan], conts)[0]
        for j, a in enumerate(options):
            loss, n, _ = labeller.conversation_loss(tiny_lm, Z, [(q, a)], plan)
            assert n == len(conts[j])
            torch.testing.assert_close(-loss, lp[j], atol=1e-3, rtol=1e-4)


def _plain_conversation_logprob(lm, Z, turns, plan):
    """Reference: the whole conversation as chat-template text, placeholders expanded and
    overwritten with each kept frame's tokens (full resolution only), one full forward, and the
    log-probabilities of each answer's tokens + end of turn, found by scanning the ids."""
    from vr_runtime.backbones.prompt import INTERNVL_TOKENS, video_content
    tok = lm.tokenizer
    kept = [t for t, w in enumerate(plan) if w]
    msgs = []
    for k, (q, a) in enumerate(turns):
        msgs.append({"role": "user", "content": video_content(q, kept) if k == 0 else q})
        msgs.append({"role": "assistant", "content": a})
    text = tok.apply_chat_template(msgs, tokenize=False)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    ctx = tok.convert_tokens_to_ids(INTERNVL_TOKENS.context)
    rows, seq = [], []
    emb_table = lm.model.get_input_embeddings().weight
    frames = iter(kept)
    for i in ids:
        if i == ctx:
            t = next(frames)
            rows.append(Z[t])
            seq += [None] * Z.shape[1]
        else:
            rows.append(emb_table[i][None])
            seq.append(i)
    x = torch.cat(rows)[None]
    logp = torch.log_softmax(lm.forward(inputs_embeds=x, logits_to_keep=0).logits[0].float(), -1)
    # answers: the tokens after each "<|im_start|>assistant\n" up to its "<|im_end|>", included
    start = tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    end = tok.convert_tokens_to_ids("<|im_end|>")
    total, n, i = 0.0, 0, 0
    while i < len(seq):
        if seq[i:i + len(start)] == start:
            j = i + len(start)
            while True:
                total += float(logp[j - 1, seq[j]])
                n += 1
                if seq[j] == end:
                    break
                j += 1
            i = j
        i += 1
    return total, n


@pytest.mark.parametrize("plan", [[1, 0, 1, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
def test_conversation_loss_matches_a_plain_full_forward(tiny_lm, plan):
    torch.manual_seed(1)
    Z = torch.randn(len(plan), 256, tiny_lm.hidden_size)
    turns = [("What shape is the red object?", "circle"),
             ("Name the outline of the cyan item.", "none"),
             ("Which shape has the color blue?", "triangle")]
    with torch.no_grad():
        loss, n, _ = labeller.conversation_loss(tiny_lm, Z, turns, plan)
        ref, n_ref = _plain_conversation_logprob(tiny_lm, Z, turns, plan)
    assert n == n_ref
    torch.testing.assert_close(-loss.item(), ref, atol=2e-3, rtol=1e-4)


def test_conversation_loss_trains_through_the_packed_frames(tiny_lm):
    Z = torch.randn(3, 256, tiny_lm.hidden_size, requires_grad=True)
    loss, _, _ = labeller.conversation_loss(
        tiny_lm, Z, [("What shape is the red object?", "circle"),
                     ("What shape is the blue thing?", "none")], [1, 0, 4])
    loss.backward()
    g = Z.grad.abs().sum((1, 2))
    assert g[0] > 0 and g[2] > 0 and g[1] == 0     # the dropped frame gets no gradient


def test_video_questions_ask_every_absent_color_never_a_distractor():
    rng = random.Random(5)
    spec = synthetic_videos.sample_spec(rng, num_frames=16)
    qs = labeller.video_questions(spec, rng, all_absent=True)
    asked = sorted(q["color"] for q in qs)
    targets = sorted(c for c, _ in spec.targets)
    assert asked == sorted(targets + spec.absent_colors())
    for q in qs:
        assert q["color"] in q["question"]
        if q["color"] in spec.absent_colors():
            assert q["answer"] == synthetic_videos.ABSENT_ANSWER and not any(q["frame_labels"])
    one = labeller.video_questions(spec, random.Random(5), all_absent=False)
    assert sum(q["category"] == "absent_color" for q in one) == 1


def test_conversation_needs_a_turn(tiny_lm):
    with pytest.raises(ValueError, match="turns"):
        labeller.conversation_loss(tiny_lm, torch.zeros(2, 256, tiny_lm.hidden_size), [], [1, 1])


def test_shipped_config_loads():
    cfg = labeller.LabellerConfig.load("tiny_labeller")
    assert cfg.init == "tiny" and cfg.windows == (1,) and not cfg.train_projector


@pytest.mark.parametrize("over, match", [
    ({"steps": 0}, "steps"), ({"windows": [3]}, "windows"), ({"windows": []}, "windows"),
    ({"learning_rate": 0}, "learning_rate"), ({"num_frames": 8}, "num_frames"),
    ({"heldout_videos": -1}, "heldout_videos"), ({"bogus": 1}, "unknown keys")])
def test_bad_config_is_one_clear_error(over, match):
    with pytest.raises(ConfigError, match=match):
        labeller.LabellerConfig.load("tiny_labeller", **over)


def test_cli_bad_value_is_one_line(capsys):
    from vr_tiny.__main__ import main
    assert main(["labeller", "--set", "steps=0", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: labeller steps")


def test_short_run_trains_the_llm_only(tmp_path):
    """Two steps from the shipped weights: the LLM moves, the tower and the projector do not, and
    the folder label-study loads is written with the held-out metrics."""
    from vr_runtime.backbones import load_backbone
    cfg = labeller.LabellerConfig(steps=2, batch_size=1, heldout_videos=1, log_every=1,
                                  output_dir=str(tmp_path / "lab"))
    res = labeller.train_labeller(cfg, progress=False, results=str(tmp_path / "r" / "lab.json"),
                                  command="test")
    before = load_backbone("tiny")
    after = load_backbone(str(tmp_path / "lab" / "hf"))
    sb, sa = before.model.state_dict(), after.model.state_dict()
    for name in sb:
        same = torch.equal(sb[name], sa[name])
        frozen = "vision_tower" in name or "multi_modal_projector" in name
        if frozen:
            assert same, name
    assert any(not torch.equal(sb[n], sa[n]) for n in sb if "language_model" in n)
    m = json.loads((tmp_path / "lab" / "metrics.json").read_text())
    assert m["global_step"] == 2 and m["metrics"]["reference"]["questions"] == 3
    assert set(m["metrics"]) >= {"reference/object_shape", "reference/absent_color",
                                 "random_drop"}
    assert len((tmp_path / "lab" / "log.jsonl").read_text().splitlines()) == 2
    assert res["metrics"] == m["metrics"]
    r = json.loads((tmp_path / "r" / "lab.json").read_text())
    assert r["command"] == "test" and r["device"] and r["date"] and r["torch"]
    assert r["metrics"] == m["metrics"]


def test_route_loss_is_the_heads_own_attention_weight():
    """RouteSupervision.loss == -log of the attention weight that the eager implementation
    reports for that layer and head, from each turn's answer-predicting row to its cue word."""
    from vr_runtime.backbones.internvl3 import InternVL3Backbone
    import vr_kernels
    lm = InternVL3Backbone.tiny(attn_implementation="eager")
    torch.manual_seed(2)
    plan = [1, 0, 4, 1]
    Z = torch.randn(len(plan), 256, lm.hidden_size)
    turns = [("What shape is the red object?", "circle", "red"),
             ("Which shape has the color blue?", "none", "blue"),
             ("Name the outline of the figure.", "none", "cyan")]     # no cue word: no term
    route = labeller.RouteSupervision(layer=1, head=3, weight=1.0)
    with torch.no_grad():
        ce, n, r = labeller.conversation_loss(lm, Z, turns, plan, route)
        ce0, n0, r0 = labeller.conversation_loss(lm, Z, turns, plan)
    assert r0 is None and n == n0
    torch.testing.assert_close(ce, ce0)
    # the reference: rebuild the same sequence, ask the eager attention for its weights
    from vr_runtime.backbones.prompt import render_chat
    from vr_runtime.training.stages import answer_sequence
    tok = lm.tokenizer
    ids, n_prompt, dest, _ = answer_sequence(lm, turns[0][0], turns[0][1], plan)
    rows = [(n_prompt - 1, max(i for i in range(n_prompt) if ids[i] == route.cue_id(tok, "red")))]
    start = len(ids)
    p = tok("\n" + render_chat(tok, turns[1][0]), add_special_tokens=False)["input_ids"]
    ids = ids + p
    rows.append((len(ids) - 1, max(i for i in range(start, len(ids))
                                   if ids[i] == route.cue_id(tok, "blue"))))
    emb = lm.model.get_input_embeddings()(torch.tensor(ids))
    emb = vr_kernels.pool_pack(Z, plan, (16, 16), out=emb, dest=dest)
    with torch.no_grad():
        att = lm.decoder()(inputs_embeds=emb[None], output_attentions=True,
                           return_dict=True).attentions[1][0, 3]
    ref = -torch.stack([att[a, c].log() for a, c in rows]).mean()
    torch.testing.assert_close(r, ref, atol=1e-4, rtol=1e-4)


def test_route_loss_trains_the_head():
    from vr_runtime.backbones.internvl3 import InternVL3Backbone
    lm = InternVL3Backbone.tiny()
    Z = torch.randn(2, 256, lm.hidden_size)
    _, _, r = labeller.conversation_loss(
        lm, Z, [("What shape is the red object?", "circle", "red")], [1, 1],
        labeller.RouteSupervision(layer=1, head=0))
    r.backward()
    attn = lm.decoder().layers[1].self_attn
    assert attn.q_proj.weight.grad.abs().sum() > 0 and attn.k_proj.weight.grad.abs().sum() > 0
    assert lm.decoder().layers[2].self_attn.q_proj.weight.grad is None
