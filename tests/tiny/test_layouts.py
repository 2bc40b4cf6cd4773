"""Stage 3's dense and long layouts (training/layouts.py): a stretched example keeps its event
short and its frames in time order; packing a stretched plan from the source frames equals
packing the materialised virtual clip; long plans stay inside their drawn budget and are
deterministic in the seed; dense plans are every frame at full resolution up to the cap."""
import pytest
import torch

import vr_kernels
from vr_kernels import pooled_counts
from vr_runtime.training.config import ConfigError
from vr_tiny.layouts import (CAPTION_QUESTION, caption_turn, color_first, colored,
                                        dense_cap, dialogue_turns, global_twin, keep_evidence,
                                        kept_rows, stretch, stretched_times)
from vr_runtime.training.stages import answer_sequence, dialogue_sequence
from tiny_helpers import projector_features, stage3_trainee, tiny_config

Q = "What shape is the red object?"


@pytest.mark.parametrize("T,n,rel", [(16, 300, (5, 6)), (8, 2048, (0,)), (37, 129, (3, 20, 36)),
                                     (16, 17, ())])
def test_stretch_keeps_the_event_short_and_time_ordered(T, n, rel):
    labels = [t in rel for t in range(T)]
    g = torch.Generator().manual_seed(T + n)
    src = stretch(labels, n, g, max_repeat=2)
    assert len(src) == n
    assert src == sorted(src) and set(src) == set(range(T))     # every frame, in time order
    for t in rel:
        assert 1 <= src.count(t) <= 2                           # a short event stays short
    counts = [src.count(t) for t in range(T) if t not in rel]
    assert max(counts) - min(counts) <= 1                       # the others share evenly
    g2 = torch.Generator().manual_seed(T + n)
    assert stretch(labels, n, g2, max_repeat=2) == src          # deterministic in the seed


def test_stretch_is_the_identity_when_it_cannot_stretch():
    assert stretch([True] * 8, 100) == list(range(8))           # nothing irrelevant to repeat
    assert stretch([False, True, False], 3) == [0, 1, 2]        # not longer than the source
    assert stretch([False] * 5, 2) == list(range(5))


def test_stretched_times_are_monotonic_over_the_source_span():
    times = [0.5 * t for t in range(10)]                         # 10 frames, 0.5 s apart
    v = stretched_times(times, 40)
    assert len(v) == 40 and v[0] == 0.0
    assert all(b > a for a, b in zip(v, v[1:]))
    assert v[-1] < 5.0                                           # within the source's 5 s
    assert stretched_times(None, 40) is None


@pytest.mark.parametrize("T,n,grid,D", [(5, 23, (4, 4), 8), (7, 41, (6, 4), 12)])
def test_packing_kept_rows_equals_packing_the_virtual_clip(T, n, grid, D):
    torch.manual_seed(T * n)
    Z = torch.randn(T, grid[0] * grid[1], D, dtype=torch.float64)
    src = stretch([t == 2 for t in range(T)], n, torch.Generator().manual_seed(0))
    windows = [1, 2, 4, 0, (2, 1)]
    plan = [windows[int(i)] for i in torch.randint(len(windows), (n,))]
    counts = pooled_counts(plan, grid)
    L = sum(counts) + 3 * n + 5
    starts, pos = [], 2
    for c in counts:
        if c:
            starts.append(pos)
            pos += c + 3
    dest = [starts.pop(0) if c else 0 for c in counts]
    out = torch.randn(L, D, dtype=torch.float64)
    want = vr_kernels.pool_pack(Z[torch.tensor(src)], plan, grid, out=out.clone(), dest=dest,
                                backend="reference")
    rows, plan_k, dest_k = kept_rows(plan, src, dest)
    got = vr_kernels.pool_pack(Z[torch.tensor(rows)], plan_k, grid, out=out.clone(),
                               dest=dest_k, backend="reference")
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def _ex(T, rel, policy=1):
    return {"policy": policy, "question": Q, "answer": "circle",
            "labels": torch.tensor([float(t in rel) for t in range(T)])}


@pytest.mark.parametrize("planner", ["fragment", "fragment-long-16", "fragment-long-16-mid"])
def test_long_plans_fit_their_budget_and_repeat_in_the_seed(tiny_lm, planner):
    tr = stage3_trainee(tiny_lm, long_plan_prob=1.0, long_plan_frames=[500, 1500],
                        long_plan_budget=[1024, 3000], long_plan_planners=[planner])
    T, ex = 16, _ex(16, (4, 5))
    runs = []
    for _ in range(2):
        torch.manual_seed(3)
        plan, src, times = tr.curriculum.plan(tr, torch.tensor([0.0, 1.0]), torch.zeros(T), ex)
        runs.append((plan, src))
        assert 500 <= len(plan) == len(src) <= 1500 and times is None
        assert sum(pooled_counts(plan, tr.grid)) <= 3000
        full = [src[t] for t, w in enumerate(plan) if w == 1]
        assert full and set(full) <= {4, 5}                   # the event, at full resolution
        kept = [t for t, w in enumerate(plan) if w != 0]
        if planner != "fragment":
            assert len(kept) <= 16                             # the long-prompt cap
    assert runs[0] == runs[1]


def test_a_global_example_gets_the_global_twin(tiny_lm):
    tr = stage3_trainee(tiny_lm, long_plan_prob=1.0, long_plan_frames=[600, 600],
                        long_plan_budget=[2048, 2048], long_plan_planners=["fragment-long-16-mid"])
    torch.manual_seed(0)
    ex = dict(_ex(16, ()), policy=0, labels=None)
    plan, src, _ = tr.curriculum.plan(tr, torch.tensor([1.0, 0.0]), torch.full((16,), -5.0), ex)
    kept = [w for w in plan if w != 0]
    assert len(plan) == 600 and len(kept) == 16 and set(kept) == {2}   # global-long-16
    assert global_twin("fragment-long-16-mid") == "global-long-16"


@pytest.mark.parametrize("T,cap,want", [(16, 24, 16), (40, 24, 24), (12, 0, 12)])
def test_dense_plans_are_full_resolution_up_to_the_cap(tiny_lm, T, cap, want):
    tr = stage3_trainee(tiny_lm, dense_plan_prob=1.0, dense_plan_frames=cap)
    plan, src, _ = tr.curriculum.plan(tr, torch.tensor([0.0, 1.0]), torch.zeros(T), _ex(T, (1,)))
    assert src is None and len(plan) == T
    assert sum(w == 1 for w in plan) == want and set(plan) <= {0, 1}


@pytest.mark.parametrize("T,n,rel", [(40, 6, (17, 18, 19)), (13, 3, (0, 12)), (64, 4, (30,)),
                                     (20, 2, (3, 4, 5, 6)), (9, 9, (2,))])
def test_keep_evidence_keeps_the_event_and_the_frame_count(T, n, rel):
    plan = [0] * T
    for i in range(n):                                  # the budget planner's even spread
        plan[(2 * i + 1) * T // (2 * n)] = 1
    labels = [t in rel for t in range(T)]
    out = keep_evidence(plan, labels)
    kept = [t for t, w in enumerate(out) if w]
    assert len(out) == T and len(kept) == n and set(out) <= {0, 1}   # same tokens, same window
    assert set(rel[:n]) <= set(kept)                    # the event (as much of it as fits)
    others = [t for t in kept if t not in rel]
    assert len(set(others)) == len(others) == n - min(n, len(rel))
    assert keep_evidence(plan, None) == plan            # no labels: the plan as it was
    assert keep_evidence(out, labels) == out            # already showing the event: unchanged


@pytest.mark.parametrize("T", [40, 64])
def test_dense_plans_keep_the_relevant_frames_under_a_drawn_cap(tiny_lm, T):
    tr = stage3_trainee(tiny_lm, dense_plan_prob=1.0, dense_plan_frames=[3, 6],
                        dense_plan_keep_relevant=True)
    rel = (T - 3, T - 2)                                # late: an even spread of 3-6 misses them
    counts = set()
    for seed in range(12):
        torch.manual_seed(seed)
        plan, src, _ = tr.curriculum.plan(tr, torch.tensor([0.0, 1.0]), torch.zeros(T), _ex(T, rel))
        kept = [t for t, w in enumerate(plan) if w]
        assert src is None and set(plan) <= {0, 1} and set(rel) <= set(kept)
        counts.add(len(kept))
    assert counts <= {3, 4, 5, 6} and len(counts) > 1   # the cap is drawn per example
    torch.manual_seed(0)
    tr.curriculum.options.dense_plan_keep_relevant = False             # off (the default): the even spread
    plan, _, _ = tr.curriculum.plan(tr, torch.tensor([0.0, 1.0]), torch.zeros(T), _ex(T, rel))
    assert not set(rel) <= {t for t, w in enumerate(plan) if w}


def test_a_dialogue_trains_every_answer_and_no_follow_up_question(tiny_lm):
    plan = [1, 0, 4, 1]
    turns = [(Q, "circle"), ("What shape is the blue object?", "none"),
             ("What is the background color?", "gray")]
    ids, n_prompt, dest, pos, targets = dialogue_sequence(tiny_lm, turns, plan)
    one = answer_sequence(tiny_lm, Q, "circle", plan)
    assert ids[:len(one[0])] == one[0] and n_prompt == one[1] and dest == one[2]   # turn 1 as is
    assert len(targets) == len(ids) - n_prompt
    tok = tiny_lm.tokenizer
    trained = tok.decode([t for t in targets if t != -100])
    assert [w for w in ("circle", "none", "gray") if w in trained] == ["circle", "none", "gray"]
    assert "blue" not in trained and "background" not in trained      # questions are not trained
    asked = tok.decode([i for i, t in zip(ids[n_prompt:], targets) if t == -100])
    assert "What shape is the blue object?" in asked and "background" in asked
    assert dialogue_sequence(tiny_lm, turns[:1], plan)[:4] == one    # one turn: answer_sequence


def test_dense_dialogues_ask_only_what_the_kept_frames_show(tiny_lm):
    tr = stage3_trainee(tiny_lm, dense_plan_prob=1.0, dense_plan_frames=[2, 2],
                        dense_plan_keep_relevant=True, dense_plan_dialogue=True)
    T = 12
    lab = lambda *rel: torch.tensor([float(t in rel) for t in range(T)])   # noqa: E731
    sib = [{"question": "What shape is the blue object?", "answer": "square", "labels": lab(9)},
           {"question": "What shape is the green object?", "answer": "circle", "labels": lab(5)},
           {"question": "What shape is the cyan object?", "answer": "none", "labels": lab()},
           {"question": "What is the background color?", "answer": "gray"}]
    ex = dict(_ex(T, (2,)), turns=sib)
    torch.manual_seed(0)
    plan, _, _ = tr.curriculum.plan(tr, torch.tensor([0.0, 1.0]), torch.zeros(T), ex)
    assert [t for t, w in enumerate(plan) if w] == [2, 9]   # its own event, then the first other
    turns = dialogue_turns(plan, ex)
    assert turns[0] == (Q, "circle")
    assert sorted(a for _, a in turns[1:]) == ["gray", "none", "square"]   # not green: dropped
    assert dialogue_turns([1, 4] * 6, ex) == [(Q, "circle")]   # not a dense plan: one question
    assert dialogue_turns(plan, dict(ex, turns=[])) == [(Q, "circle")]


def _dense_lm_loss(tr, v, turns):
    """The mean answer cross-entropy of ``turns`` about ``v``'s frames, all at full
    resolution, by hand (the plain reference of Stage 3's LM loss)."""
    T = v.shape[0]
    ids, n_prompt, dest, pos, target = dialogue_sequence(tr.bb, turns, [1] * T)
    emb = tr.pack(tr.project(v), [1] * T, tr.grid, tr.embed(torch.tensor(ids)), dest)
    logits = tr.lm_logits(emb.unsqueeze(0), n_prompt - 1, pos)[0]
    return torch.nn.functional.cross_entropy(logits.float(), torch.tensor(target),
                                             ignore_index=-100).detach()


def test_stage3_trains_a_dense_dialogue_only_when_asked(tiny_lm):
    """One Stage 3 step on a dense example with a sibling question: the dialogue's LM loss
    averages both answers' tokens (more tokens than one answer's), and with the option off the
    step is the one-question step."""
    T = 3
    v = None
    losses = {}
    for on in (False, True):
        tr = stage3_trainee(tiny_lm, dense_plan_prob=1.0, dense_plan_dialogue=on,
                            pool_pack_backend="torch")
        if v is None:
            v = projector_features(tr.model, T, seed=3)
        out = _dense_dialogue_step(tr, v)
        assert torch.isfinite(out["loss"])
        losses[on] = float(out["l_lm"])
        turns = [(Q, "circle")] + ([("What is the background color?", "gray")] if on else [])
        torch.testing.assert_close(out["l_lm"], _dense_lm_loss(tr, v, turns), rtol=1e-5,
                                   atol=1e-5)
    assert losses[True] != losses[False]


def _dense_dialogue_step(tr, v):
    """One Stage 3 step (seeded) on a red-circle example over ``v``'s frames, the first
    relevant, with one sibling question about the background."""
    q = torch.tensor(tr.tokenizer(Q, add_special_tokens=False)["input_ids"])
    sib = [{"question": "What is the background color?", "answer": "gray"}]
    ex = dict(_ex(len(v), (1,)), v=v, q_ids=q, times=None, turns=sib)
    torch.manual_seed(5)
    return tr.stage3([ex])


def test_a_caption_names_each_asked_color_with_its_shape():
    turns = [(Q, "circle"), ("Look for the blue thing: what form is it?", "none"),
             ("Which shape has the color green?", "triangle"),
             ("What is the background color?", "gray"),
             ("What shape is the large cyan object?", "square")]
    seen = set()
    for seed in range(20):
        torch.manual_seed(seed)
        q, caption = caption_turn(turns)
        words = caption.split()
        assert q == CAPTION_QUESTION and caption.startswith(" ")
        assert dict(zip(words[::2], words[1::2])) == {"red": "circle", "blue": "no",
                                                      "green": "triangle"}
        seen.add(tuple(words[::2]))
    assert len(seen) == 6                                # every order of the three colors
    assert caption_turn([("What is the background color?", "gray")]) is None
    assert caption_turn([("What shape is the big red object?", "circle")]) is None


def test_each_caption_shape_is_one_token_after_its_color(tiny_lm):
    tok = tiny_lm.tokenizer
    torch.manual_seed(0)
    _, caption = caption_turn([(Q, "circle"), ("What shape is the blue object?", "none")])
    pieces = tok.convert_ids_to_tokens(tok(caption, add_special_tokens=False)["input_ids"])
    assert [p.lstrip("Ġ") for p in pieces] == caption.split()


def test_stage3_replaces_a_dense_dialogue_by_its_caption(tiny_lm):
    """caption_turn_prob 1: the dense example's sequence is its caption alone (the LM loss of
    that one turn, by hand); a plan that is not dense keeps its question."""
    T = 3
    tr = stage3_trainee(tiny_lm, dense_plan_prob=1.0, dense_plan_dialogue=True,
                        caption_turn_prob=1.0, pool_pack_backend="torch")
    v = projector_features(tr.model, T, seed=4)
    out = _dense_dialogue_step(tr, v)
    turns = [(CAPTION_QUESTION, " red circle")]
    torch.testing.assert_close(out["l_lm"], _dense_lm_loss(tr, v, turns), rtol=1e-5, atol=1e-5)
    ids, n_prompt, _, _, _ = dialogue_sequence(tr.bb, turns, [1] * T)
    assert tr.tokenizer.decode(ids[n_prompt:-1]).split() == ["red", "circle"]


def test_color_first_puts_the_asked_color_before_a_shape():
    assert color_first(Q, "circle") == "red circle"
    assert color_first("Which shape has the color green?", "triangle") == "green triangle"
    assert color_first(Q, "none") == "none"                          # no object: no shape
    assert color_first("What is the background color?", "gray") == "gray"
    assert color_first("What shape is the large cyan object?", "square") == "square"   # 2 cyans
    turns = [(Q, "circle"), (CAPTION_QUESTION, " red circle blue no")]
    assert colored(turns, False) == turns
    assert colored(turns, True) == [(Q, "red circle"), turns[1]]     # a caption is left as is


def test_stage3_answers_color_first_only_when_asked(tiny_lm):
    """color_first_answers: one Stage 3 step on a dense dialogue trains " red circle" for the
    shape question and the background's answer as it was (the LM loss by hand); a caption
    (caption_turn_prob 1) is the same caption with the option on."""
    T = 3
    for caption in (0.0, 1.0):
        tr = stage3_trainee(tiny_lm, dense_plan_prob=1.0, dense_plan_dialogue=True,
                            caption_turn_prob=caption, color_first_answers=True,
                            pool_pack_backend="torch")
        v = projector_features(tr.model, T, seed=6)
        out = _dense_dialogue_step(tr, v)
        turns = [(CAPTION_QUESTION, " red circle")] if caption else \
            [(Q, "red circle"), ("What is the background color?", "gray")]
        torch.testing.assert_close(out["l_lm"], _dense_lm_loss(tr, v, turns), rtol=1e-5,
                                   atol=1e-5)


def test_dense_cap_is_the_int_or_a_draw_in_range():
    assert dense_cap(0) == 0 and dense_cap(24) == 24
    g = torch.Generator().manual_seed(1)
    draws = {dense_cap([4, 7], g) for _ in range(60)}
    assert draws == {4, 5, 6, 7}


def test_stage3_trains_on_a_long_layout(tiny_lm):
    """One Stage 3 step on a stretched example: a finite loss, a gradient at the projector, and
    the same loss as packing the materialised virtual clip by hand."""
    tr = stage3_trainee(tiny_lm, long_plan_prob=1.0, long_plan_frames=[150, 150],
                        long_plan_budget=[600, 600], pool_pack_backend="torch")
    T = 6
    v = projector_features(tr.model, T)                # pre-projector features, as the cache holds
    q = torch.tensor(tr.tokenizer(Q, add_special_tokens=False)["input_ids"])
    ex = dict(_ex(T, (3,)), v=v, q_ids=q, times=None)
    torch.manual_seed(5)
    out = tr.stage3([ex])
    assert torch.isfinite(out["loss"])
    out["loss"].backward()
    grads = [p.grad for n, p in tr.model.named_parameters() if "projector" in n]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    # the same draws, with the virtual clip materialised: the same LM loss
    torch.manual_seed(5)
    pol = tr.routers.policy_logits(tr.embed(q).unsqueeze(0)).float()
    fr = tr.frame_loss(tr.project(v), tr.embed(q), ex["labels"])   # the same draws as stage3
    plan, src, times = tr.curriculum.plan(tr, pol.detach()[0], torch.zeros(T), ex)
    ids, n_prompt, dest, pos = answer_sequence(tr.bb, Q, "circle", plan, times)
    emb = tr.embed(torch.tensor(ids))
    emb = tr.pack(tr.project(v)[torch.tensor(src)], plan, tr.grid, emb, dest)
    logits = tr.lm_logits(emb.unsqueeze(0), n_prompt - 1, pos)[0]
    want = torch.nn.functional.cross_entropy(logits.float(), torch.tensor(ids[n_prompt:]))
    assert fr is not None
    torch.testing.assert_close(out["l_lm"], want.detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("over,msg", [
    ({"dense_plan_prob": 0.6, "long_plan_prob": 0.6}, r"dense_plan_prob \+ long_plan_prob"),
    ({"long_plan_frames": [0, 10]}, "long_plan_frames"),
    ({"long_plan_budget": [10]}, "long_plan_budget"),
    ({"long_plan_planners": ["fragment-literal"]}, "long_plan_planners"),
    ({"long_plan_planners": ["uniform"]}, "long_plan_planners"),
    ({"dense_plan_frames": -1}, "dense_plan_frames"),
    ({"dense_plan_frames": [0, 8]}, "dense_plan_frames"),
    ({"dense_plan_frames": [9, 8]}, "dense_plan_frames"),
    ({"dense_plan_frames": [4, 8, 12]}, "dense_plan_frames"),
    ({"caption_turn_prob": 1.5, "dense_plan_dialogue": True}, "caption_turn_prob"),
    ({"caption_turn_prob": 0.5}, "caption_turn_prob: a caption replaces a dense dialogue")])
def test_bad_layout_settings_are_one_line(over, msg):
    with pytest.raises(ConfigError, match=msg):
        tiny_config("tiny_stage3", **over).validate()


def test_the_shipped_stage3c_config_loads():
    o = tiny_config("tiny_stage3c").validate().extensions["tiny"]
    assert o.dense_plan_prob > 0 and o.long_plan_prob > 0
    assert o.dense_plan_prob + o.long_plan_prob < 1           # inference-matched plans stay


def test_stage3_items_carry_the_questions_about_the_same_frames_only_for_dialogues(tiny_lm):
    from vr_runtime.training.data import Example
    from vr_runtime.training.loop import StageDataset
    exs = [Example("a.mp4", Q, "circle", [0, 1], frames=2),
           Example("a.mp4", "What is the background color?", "gray", frames=2),
           Example("a.mp4", Q, "square", [1, 0, 0, 0], frames=4),   # other frames of a.mp4
           Example("b.mp4", Q, "none", [0, 0], frames=2),
           Example("a.mp4", "Is it there?", None, frames=2)]         # no answer: never a turn
    ds = StageDataset(exs, 3, tiny_lm.tokenizer, dialogues=True)
    assert ds.siblings == [[1], [0], [], [], []]
    assert ds._turn(exs[0])["labels"].tolist() == [0.0, 1.0]
    assert "labels" not in ds._turn(exs[1])
    assert StageDataset(exs, 3, tiny_lm.tokenizer).siblings is None   # off: nothing gathered


@pytest.mark.parametrize("on", [False, True])
def test_held_out_answers_are_scored_in_the_trained_format(on, monkeypatch):
    """eval_answers compares a generated answer with the example's answer in the format the
    stage trains: " red circle" is right with color_first_answers and wrong without."""
    from types import SimpleNamespace

    from vr_runtime.training import evaluate
    from vr_runtime.training.data import Example
    from vr_tiny.curriculum import TinyCurriculum
    from vr_tiny.options import TinyOptions
    said = {Q: "red circle", "What is the background color?": "gray"}
    monkeypatch.setattr(evaluate, "answer",
                        lambda tr, ex, v, max_length=None: (said[ex.question], [1], True))
    cfg = SimpleNamespace(model_max_length=64)
    tr = SimpleNamespace(cfg=cfg, curriculum=TinyCurriculum(cfg, TinyOptions(
        color_first_answers=on)))
    exs = [Example("a.mp4", Q, "circle", policy=1),
           Example("a.mp4", "What is the background color?", "gray", policy=1)]
    res = evaluate.eval_answers(tr, exs, SimpleNamespace(get=lambda video, frames: None))
    assert res["answer_accuracy"] == (1.0 if on else 0.5)
    assert res["samples"][0]["answer"] == ("red circle" if on else "circle")
