"""The tiny curriculum in the trainer's seams (vr_tiny/curriculum.py): its random plans, its
frozen input embeddings, and with every option off it trains as the paper's curriculum does,
draw for draw."""
import pytest
import torch

from tiny_helpers import projector_features, stage3_trainee, tiny_config
from vr_runtime.training.config import ConfigError
from vr_runtime.training.curriculum import Curriculum
from vr_tiny.curriculum import TinyCurriculum

T = 16
Q = "What shape is the red object?"


def _ex(relevant, T=T):
    return {"policy": 1, "question": Q, "answer": "circle",
            "labels": torch.tensor([float(t in relevant) for t in range(T)])}


def _plan(tr, ex):
    return tr.curriculum.plan(tr, torch.tensor([0.0, 1.0]), torch.zeros(len(ex["labels"])), ex)


def test_random_plans_are_uniform_or_mixed_and_leave_the_labels(tiny_lm):
    torch.manual_seed(0)
    tr = stage3_trainee(tiny_lm, train_max_length=[1000, 1000], random_plan_prob=1.0,
                        random_plan_windows=[1, 2, 4])
    ex = _ex([3, 4])
    before = ex["labels"].clone()
    kinds = set()
    for _ in range(40):
        plan, src, _ = _plan(tr, ex)
        assert src is None and len(plan) == T and set(plan) <= {1, 2, 4}
        kinds.add("uniform" if len(set(plan)) == 1 else "mixed")
        # train_max_length does not apply (all 16 frames at full resolution is 4,096 tokens)
    assert kinds == {"uniform", "mixed"}
    assert torch.equal(ex["labels"], before)


def test_random_plan_that_does_not_fit_falls_back_to_the_usual_plan(tiny_lm):
    tr = stage3_trainee(tiny_lm, train_max_length=[], model_max_length=1400,
                        random_plan_prob=1.0, random_plan_windows=[1])   # 16 x 256 never fit
    usual = stage3_trainee(tiny_lm, train_max_length=[], model_max_length=1400)
    ex = _ex([3, 4])
    assert _plan(tr, ex)[0] == usual.training_plan(torch.tensor([0.0, 1.0]), torch.zeros(T),
                                                   ex)[0]


@pytest.mark.parametrize("over,msg", [({"random_plan_prob": 1.5}, "tiny.random_plan_prob"),
                                      ({"random_plan_windows": []}, "random_plan_windows"),
                                      ({"random_plan_windows": [0, 2]}, "random_plan_windows")])
def test_random_plan_options_are_checked(over, msg):
    with pytest.raises(ConfigError, match=msg):
        tiny_config("tiny_stage3", **over)


def test_frozen_embeddings_and_projector_leave_the_routers_inputs_as_they_were(tiny_lm):
    """``freeze_embeddings`` with ``freeze_mlp``: a Stage 3 step trains the decoder and the LM
    head while the question's embeddings and the projected frames, what the routers read, do not
    move."""
    from vr_runtime.training.loop import build
    torch.manual_seed(0)
    cfg = tiny_config("tiny_stage3", routers=None, plan_from="labels", frames_per_example=0,
                      freeze_mlp=True, freeze_embeddings=True, freeze_feature_extractor=True,
                      freeze_Semantic_Router=True, freeze_Image_Router=True, router_dim=32)
    _, _, tr, params = build(cfg, lm=tiny_lm)
    emb = tiny_lm.model.get_input_embeddings().weight
    assert all(p is not emb for p in params) and not emb.requires_grad
    ids = torch.tensor(tiny_lm.tokenizer(Q, add_special_tokens=False)["input_ids"])
    batch = [dict(_ex([1, 2], T=4), v=projector_features(tiny_lm.model, 4, seed=0), q_ids=ids)]
    before = [(tr.embed(ex["q_ids"]).detach().clone(), tr.project(ex["v"]).detach().clone())
              for ex in batch]
    lm_head = tiny_lm.lm_head().weight.detach().clone()
    opt = torch.optim.SGD(params, lr=1.0)
    tr(batch)["loss"].backward()
    opt.step()
    for ex, (q, z) in zip(batch, before):
        assert torch.equal(tr.embed(ex["q_ids"]), q) and torch.equal(tr.project(ex["v"]), z)
    assert not torch.equal(tiny_lm.lm_head().weight, lm_head)        # the answerer did train


def test_every_option_off_trains_as_the_paper_curriculum(tiny_lm):
    """A ``tiny`` section of defaults lays examples out as the paper's curriculum does and adds
    no loss: the same losses from the same seed (no option that is off draws a number)."""
    import copy
    paper = stage3_trainee(copy.deepcopy(tiny_lm), train_max_length=[1000, 2200],
                           false_positive_prob=0.5)
    tiny = stage3_trainee(tiny_lm, train_max_length=[1000, 2200], false_positive_prob=0.5,
                          random_plan_prob=0.0)
    assert type(paper.curriculum) is Curriculum and type(tiny.curriculum) is TinyCurriculum
    ids = torch.tensor(tiny_lm.tokenizer(Q, add_special_tokens=False)["input_ids"])
    batch = [dict(_ex([t, t + 1], T=6), v=projector_features(tiny_lm.model, 6, seed=t),
                  q_ids=ids) for t in range(3)]
    outs = []
    for tr in (paper, tiny):
        torch.manual_seed(3)
        outs.append(tr(batch))
        outs[-1]["draw"] = torch.rand(())   # where the random stream stands afterwards
    for k in ("loss", "l_lm", "l_img", "l_sem", "draw"):
        assert torch.equal(outs[0][k], outs[1][k]), k
