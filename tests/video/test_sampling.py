"""What a request asks of a video file (vr_runtime.video.sampling): one place for the sampling
defaults, read by the request, the flags, the server, lmms-eval's model and the loader."""
import inspect

import pytest

from vr_runtime.video.sampling import MAX_FRAMES, MIN_FRAMES, NUM_FRAMES, FrameSpec, Sampling


def test_every_front_door_reads_the_one_set_of_defaults():
    from vr_runtime.cli_args import ANSWER_FLAGS
    from vr_runtime.request import AnswerOptions
    from vr_runtime.serve.schema import Limits
    from vr_runtime.video.load import load_video, rate_frames
    o = AnswerOptions()
    assert (o.num_frames, o.min_frames, o.max_frames) == (NUM_FRAMES, MIN_FRAMES, MAX_FRAMES)
    assert o.sampling == Sampling()
    flags = {f: ANSWER_FLAGS[f]()["default"] for f in ("--frames", "--min-frames", "--max-frames")}
    assert flags == {"--frames": NUM_FRAMES, "--min-frames": MIN_FRAMES,
                     "--max-frames": MAX_FRAMES}
    assert Limits().num_frames == NUM_FRAMES
    assert inspect.signature(load_video).parameters["num_frames"].default == NUM_FRAMES
    rate = inspect.signature(rate_frames).parameters
    assert (rate["min_frames"].default, rate["max_frames"].default) == (MIN_FRAMES, MAX_FRAMES)


def test_lmms_model_defaults_are_the_same():
    pytest.importorskip("lmms_eval")
    from vr_runtime.eval.lmms_model import VideoRouterLMM
    p = inspect.signature(VideoRouterLMM.__init__).parameters
    assert (p["num_frames"].default, p["min_frames"].default, p["max_frames"].default) == \
        (NUM_FRAMES, MIN_FRAMES, MAX_FRAMES)


def test_the_flags_and_options_give_the_same_sampling():
    from vr_runtime.cli_args import Parser, add_answer_args, answer_options, sampling_of
    p = Parser(prog="t")
    add_answer_args(p)
    args = p.parse_args(["--frames", "9", "--fps", "2", "--max-frames", "30", "--seek",
                         "keyframe"])
    s = sampling_of(args)
    assert s == Sampling(9, None, 2.0, MIN_FRAMES, 30, "auto", "keyframe")
    assert answer_options(args).sampling == s and s.rate == (2.0, MIN_FRAMES, 30)


def test_frame_spec_square():
    s = FrameSpec.square(24, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    assert s == FrameSpec((24, 24), (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    from vr_runtime.backbones import FrameSpec as from_backbones
    assert from_backbones is FrameSpec


def test_frame_spec_keeps_bad_values_for_the_loaders_one_line_error():
    """``FrameSpec.square`` coerces nothing: a size or mean the loader refuses reaches its
    check, which names it (not a ValueError from int() or tuple())."""
    import pathlib

    from vr_runtime.errors import VideoError
    from vr_runtime.video.load import load_video
    sample = pathlib.Path(__file__).resolve().parents[2] / "vr_runtime" / "assets" / "sample.mp4"
    for kw, what in ((dict(size="abc"), "size must be an integer"),
                     (dict(size=1.5), "size must be an integer"),
                     (dict(mean=5), "mean must be 3 numbers")):
        with pytest.raises(VideoError, match=what):
            load_video(str(sample), num_frames=2, **kw)
