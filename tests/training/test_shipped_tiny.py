"""The shipped tiny weights (trained by scripts/train_tiny.sh) route the bundled demo clip:
the Fragment question keeps the evidence frames, the Global question is routed Global."""
import pathlib

import numpy as np
import pytest
import torch

ASSETS = pathlib.Path(__file__).resolve().parents[2] / "vr_runtime" / "assets" / "tiny"
pytestmark = pytest.mark.skipif(not (ASSETS / "routers.safetensors").is_file()
                                or not (ASSETS / "model.safetensors").is_file(),
                                reason="tiny weights not trained yet (scripts/train_tiny.sh)")


@torch.no_grad()
def test_shipped_routers_find_the_demo_evidence():
    from vr_runtime.backbones import load_backbone
    from vr_runtime.routers import Routers, embed_question
    from vr_runtime.training.synthetic import DEMO_QUESTIONS, demo_spec, render_frame
    from vr_runtime.video import preprocess_frames

    lm = load_backbone("tiny")
    routers = Routers.load(ASSETS / "routers.safetensors", lm)
    assert routers.trained
    spec = demo_spec()
    pv = preprocess_frames(np.stack([render_frame(spec, t) for t in range(spec.num_frames)]))
    Z = lm.encode_frames(pv)
    frag = embed_question(lm.model, lm.tokenizer, DEMO_QUESTIONS["fragment"])
    glob = embed_question(lm.model, lm.tokenizer, DEMO_QUESTIONS["global"])
    assert routers.policy_logits(frag[None]).argmax(-1).item() == 1
    assert routers.policy_logits(glob[None]).argmax(-1).item() == 0
    probs = routers.frame_probs(Z, frag)
    evidence = spec.frames_with("red")
    assert bool((probs[evidence] > 0.5).all())
    # the evidence frames score highest and are the only ones above 0.5 (frame 0, a blue
    # square, was a false positive before Stage 3b; now ~0.29)
    assert sorted(probs.topk(len(evidence)).indices.tolist()) == evidence
    assert int((probs > 0.5).sum()) == len(evidence)


def test_demo_answers_with_the_shipped_weights():
    """`videorouter demo`'s settings end to end (decoding the bundled mp4, both routers, the
    budgeted plan, generation): the Fragment question keeps frames 5-7 at full resolution and
    is answered 'circle'; the Global question is pooled uniformly and answered 'black'."""
    from vr_runtime import VideoRouter
    from vr_runtime.cli import (DEMO_FRAMES, DEMO_MAX_LENGTH, DEMO_MAX_NEW_TOKENS, DEMO_QUESTION,
                                SAMPLE_VIDEO)
    from vr_runtime.training.synthetic import DEMO_QUESTIONS, demo_spec

    vr = VideoRouter.from_pretrained("tiny")
    kw = dict(num_frames=DEMO_FRAMES, max_length=DEMO_MAX_LENGTH, max_new_tokens=DEMO_MAX_NEW_TOKENS)
    assert DEMO_QUESTION == DEMO_QUESTIONS["fragment"]
    frag = vr.answer(str(SAMPLE_VIDEO), DEMO_QUESTION, **kw)
    rep = frag.report
    assert rep["policy"] == "fragment" and rep["routers_trained"]
    evidence = demo_spec().frames_with("red")
    assert [t for t, w in enumerate(rep["scales"]) if w == 1] == evidence
    assert rep["visual_tokens"] <= rep["budget"] < rep["dense_visual_tokens"]
    assert frag.text == "circle"
    glob = vr.answer(str(SAMPLE_VIDEO), DEMO_QUESTIONS["global"], **kw)
    assert glob.report["policy"] == "global" and set(glob.report["scales"]) == {2}
    assert glob.text == "black"
