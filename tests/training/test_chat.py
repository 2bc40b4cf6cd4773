"""Training dialogues in the tokenizer's chat template (vr_runtime/training/chat.py): the
pieces read off the template, and the tiny tokenizer's sequences token for token as ChatML
spelt them when the format was written out in the trainer."""
import pytest

from vr_runtime.training.chat import chat_turns
from vr_runtime.training.stages import dialogue_sequence

TURNS = [("What shape is the red object?", "red circle"),
         ("What is the background color?", "gray"), ("Is there a cyan object?", "none")]


def chatml_ids(tok, prompt_ids, turns):
    """The ids the trainer laid out with ChatML literals: each later turn
    '\\n<|im_start|>user\\n{q}<|im_end|>\\n<|im_start|>assistant\\n', each answer + <|im_end|>."""
    end = tok.convert_tokens_to_ids("<|im_end|>")
    ids = list(prompt_ids)
    for k, (q, a) in enumerate(turns):
        if k:
            text = f"\n<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
            ids += tok(text, add_special_tokens=False)["input_ids"]
        ids += tok(a, add_special_tokens=False)["input_ids"] + [end]
    return ids


def test_the_pieces_of_a_chatml_template(tiny_lm):
    t = chat_turns(tiny_lm.tokenizer)
    assert (t.end, t.follow_up("Q?")) == ("<|im_end|>",
                                          "\n<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n")
    assert chat_turns(tiny_lm.tokenizer) is t                    # read once per tokenizer


@pytest.mark.parametrize("n", [1, 2, 3])
def test_tiny_sequences_are_the_chatml_ids(tiny_lm, n):
    plan = [1, 0, 4, 2]
    ids, n_prompt, _, _, targets = dialogue_sequence(tiny_lm, TURNS[:n], plan)
    assert ids == chatml_ids(tiny_lm.tokenizer, ids[:n_prompt], TURNS[:n])
    answers = [i for i, y in zip(ids[n_prompt:], targets) if y != -100]
    assert answers == [y for y in targets if y != -100]


def test_a_tokenizer_without_a_template_is_laid_out_as_the_runtime_renders_it(tiny_lm):
    """Without a chat template the runtime's prompt is ChatML (``render_messages``), and so is
    the dialogue (a saved tiny model's tokenizer has none)."""
    import copy
    tok = copy.deepcopy(tiny_lm.tokenizer)
    tok.chat_template = None
    assert chat_turns(tok) == chat_turns(tiny_lm.tokenizer)


def test_a_template_that_does_not_append_turns_is_one_line(tiny_lm):
    import copy
    tok = copy.deepcopy(tiny_lm.tokenizer)
    tok.chat_template = "{{ messages[-1]['content'] }}"         # the last message alone
    with pytest.raises(ValueError, match="does not continue its first turn"):
        chat_turns(tok)
