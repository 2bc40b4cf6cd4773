"""The clip-caption study (scripts/studies/clip_captions.py): a clip never gives one colour two
shapes, its caption answers every colour from the clip's frames, and the frames sit in the video
prompt's placeholder rows."""
import importlib.util
import pathlib
import random

import torch

from vr_runtime.backbones.internvl3 import InternVL3Backbone
from vr_runtime.data.synthetic_videos import COLORS
from vr_tiny.pretrain import CaptionTokens, PretrainConfig, render_bank

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("clip_captions",
                                              ROOT / "scripts" / "studies" / "clip_captions.py")
cc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cc)


def test_clips_and_their_captions():
    bb = InternVL3Backbone.tiny(device="cpu", dtype=torch.float32)
    V, specs = render_bank(24, PretrainConfig(), 3, bb)
    rng = random.Random(0)
    for k in (1, 3, 5):
        idx = cc.draw_clip(rng, specs, k)
        assert len(set(idx)) == k
        seen = {}
        for i in idx:
            for s in specs[i].shapes:
                assert seen.setdefault(s.color, s.shape) == s.shape
    toks = CaptionTokens(bb.tokenizer)
    state = rng.getstate()
    x, tgt = cc.clip_batch(bb, V, specs, toks, rng, 3, 2)
    ids, starts = bb.build_prompt(cc.QUESTION, [256] * 3)
    assert x.shape == (2, len(ids) + 2 * len(COLORS), bb.hidden_size)
    assert tgt.shape == (2, 2 * len(COLORS)) and (tgt[:, 1::2] == -100).all()
    rng.setstate(state)                           # the same draws: the first clip's frames
    idx = cc.draw_clip(rng, specs, 3)
    Z = bb.project(V[idx].float())
    for t, d in enumerate(starts):
        torch.testing.assert_close(x[0, d:d + 256], Z[t])
    shape_of = {s.color: s.shape for i in idx for s in specs[i].shapes}
    words = {v: w for w, v in toks.ids.items()}
    answers = [words[int(a)] for a in tgt[0, 0::2]]
    assert sorted(a for a in answers if a != "no") == sorted(shape_of.values())
