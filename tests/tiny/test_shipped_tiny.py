"""The shipped tiny weights (trained by scripts/tiny/train_tiny.sh) route the bundled demo clip by the
question: "red" keeps the red circle's frames (5-7), "blue" the blue square's (11-12), the colors
that are not in the clip (magenta, cyan) mark no frame, the Global question is routed Global, and
both shapes are answered right."""
import pathlib

import numpy as np
import pytest
import torch

ASSETS = pathlib.Path(__file__).resolve().parents[2] / "vr_runtime" / "assets" / "tiny"
pytestmark = pytest.mark.skipif(not (ASSETS / "routers.safetensors").is_file()
                                or not (ASSETS / "model.safetensors").is_file(),
                                reason="tiny weights not trained yet (scripts/tiny/train_tiny.sh)")


@torch.no_grad()
def test_shipped_routers_find_the_demo_evidence():
    from vr_runtime.backbones import load_backbone
    from vr_runtime.routing.routers import Routers, embed_question
    from vr_runtime.data.synthetic_videos import DEMO_QUESTIONS, demo_spec, render_frame
    from vr_runtime.video.load import preprocess_frames

    lm = load_backbone("tiny")
    routers = Routers.load(ASSETS / "routers.safetensors", lm)
    assert routers.trained
    spec = demo_spec()
    pv = preprocess_frames(np.stack([render_frame(spec, t) for t in range(spec.num_frames)]))
    Z = lm.encode_frames(pv)
    glob = embed_question(lm.model, lm.tokenizer, DEMO_QUESTIONS["global"])
    assert routers.policy_logits(glob[None]).argmax(-1).item() == 0
    for key, color in (("fragment", "red"), ("fragment_2", "blue")):
        q = embed_question(lm.model, lm.tokenizer, DEMO_QUESTIONS[key])
        assert routers.policy_logits(q[None]).argmax(-1).item() == 1
        probs = routers.frame_probs(Z, q)
        evidence = spec.frames_with(color)
        # exactly the queried color's frames are relevant, the other target's are not
        assert sorted(torch.nonzero(probs > 0.5).flatten().tolist()) == evidence, (color, probs)
    # magenta and cyan are absent from the clip: nothing is relevant, so the runtime falls back
    # to Global (cyan is the hard one: next to blue, and the clip holds a big blue square)
    for color in ("magenta", "cyan"):
        q = embed_question(lm.model, lm.tokenizer, f"What shape is the {color} object?")
        assert int((routers.frame_probs(Z, q) > 0.5).sum()) == 0, color


def test_demo_answers_with_the_shipped_weights():
    """`videorouter demo`'s settings end to end (decoding the bundled mp4, both routers, the
    budgeted plan, generation): each color keeps its own frames at full resolution and is
    answered with its shape after its color ('red circle', 'blue square'); the Global question
    is pooled uniformly and answered 'black'."""
    from vr_runtime import VideoRouter
    from vr_runtime.cli import (DEMO_FRAMES, DEMO_MAX_LENGTH, DEMO_MAX_NEW_TOKENS, DEMO_QUESTIONS,
                                SAMPLE_VIDEO)
    from vr_runtime.data.synthetic_videos import DEMO_ANSWERS, demo_spec

    vr = VideoRouter.from_pretrained("tiny")
    kw = dict(num_frames=DEMO_FRAMES, max_length=DEMO_MAX_LENGTH, max_new_tokens=DEMO_MAX_NEW_TOKENS)
    kept = []
    for q, color, ans in zip(DEMO_QUESTIONS, ("red", "blue"),
                             (DEMO_ANSWERS["fragment"], DEMO_ANSWERS["fragment_2"])):
        res = vr.answer(str(SAMPLE_VIDEO), q, **kw)
        rep = res.report
        assert rep["policy"] == "fragment" and rep["routers_trained"]
        full = [t for t, w in enumerate(rep["windows"]) if w == 1]
        assert full == demo_spec().frames_with(color), (q, rep["windows"])
        assert rep["visual_tokens"] <= rep["budget"] < rep["dense_visual_tokens"]
        assert res.text == ans, (q, res.text)
        kept.append(full)
    assert kept[0] != kept[1]
    glob = vr.answer(str(SAMPLE_VIDEO), "What is the background color?", **kw)
    assert glob.report["policy"] == "global" and set(glob.report["windows"]) == {2}
    assert glob.text == DEMO_ANSWERS["global"]


def test_demo_command_shows_both_questions(tmp_path, cli_here, monkeypatch):
    """The `videorouter demo` command itself (in this process; tests/runtime/test_cli.py runs it
    as a subprocess): both questions, their frames and answers in the text output, and one plot
    panel per question."""
    from PIL import Image
    png = tmp_path / "demo.png"
    monkeypatch.setenv("VIDEOROUTER_PLAIN", "1")
    res = cli_here("demo", "--plot", png)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "What shape is the red object? -> 'red circle'; frames at full resolution: 5, 6, 7" in out
    assert "What shape is the blue object? -> 'blue square'; frames at full resolution: 11, 12\n" in out
    with Image.open(png) as im:
        assert im.size[1] >= 2 * 300   # two stacked panels
