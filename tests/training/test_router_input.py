"""One router input (issue 27, item 7): training and inference give the routers the same text,
the bare question (H_q = E(Emb(q))), while the LLM reads the multiple-choice prompt."""
import torch

from vr_runtime.eval.prompting import mc_prompt
from vr_runtime.training.data import bare_question, parse_record

BARE = "What shape is the red object?"
OPTIONS = ["circle", "square", "triangle"]


def _record(**extra):
    return {"video": "v.mp4", "conversations": [
        {"from": "human", "value": "<video>\n" + mc_prompt(BARE, OPTIONS)},
        {"from": "gpt", "value": "A"}], "policy": 1, **extra}


def test_conversation_line_routes_the_bare_question():
    ex = parse_record(_record(), "conversation", "f.jsonl:1")
    assert ex.question == mc_prompt(BARE, OPTIONS)           # the LLM's Stage 3 prompt
    assert ex.routed_question == BARE                        # the routers' text
    # an explicit "question" field is what the routers read
    ex = parse_record(_record(question="Which shape is red?"), "conversation", "f.jsonl:1")
    assert ex.routed_question == "Which shape is red?"
    # a plain question (the synthetic task's lines) is its own router text
    plain = {"video": "v.mp4", "conversations": [{"from": "human", "value": "<video>\n" + BARE},
                                                 {"from": "gpt", "value": "circle"}]}
    ex = parse_record(plain, "conversation", "f.jsonl:1")
    assert ex.question == ex.routed_question == BARE and ex.router_question is None
    # the first line is the question even when it looks like an option
    assert bare_question("A. first line\nB. x\nC. y") == "A. first line"


def test_training_dataset_and_answer_give_the_routers_the_same_ids():
    """The Stage 3 dataset's router ids for one example are exactly the ids ``answer()`` embeds
    for the routers when eval asks the same example (prompt to the LLM, bare question to the
    routers), and not the prompt's."""
    from vr_runtime import VideoRouter
    from vr_runtime.training.loop import StageDataset
    vr = VideoRouter.from_pretrained("tiny")
    ex = parse_record(_record(), "conversation", "f.jsonl:1")
    ds = StageDataset([ex], 3, vr.lm.tokenizer)
    train_ids = ds.q_ids[0].tolist()
    prompt_ids = vr.lm.tokenizer(ex.question, add_special_tokens=False)["input_ids"]
    assert train_ids != prompt_ids

    seen = []
    emb = vr.lm.model.get_input_embeddings()
    h = emb.register_forward_hook(lambda m, args, out: seen.append(args[0].flatten().tolist()))
    try:
        frames = torch.randn(4, 3, 448, 448, generator=torch.Generator().manual_seed(1))
        # as vr_runtime.eval.runner asks it: the prompt to the LLM, the bare question to routers
        vr.answer(frames, ex.question, router_question=BARE, policy="fragment", num_frames=4,
                  budget=600, max_new_tokens=1)
    finally:
        h.remove()
    # the routers' calls: shorter than any LLM prompt, longer than one decoded token
    router_calls = [ids for ids in seen if 1 < len(ids) < len(prompt_ids)]
    assert router_calls and all(ids == train_ids for ids in router_calls)
