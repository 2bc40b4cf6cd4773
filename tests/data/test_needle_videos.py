"""The needle task's clips: three 2-second targets, a wandering distractor, cheap to decode."""
import random

import av
import numpy as np
import pytest

from vr_runtime.data import needle_videos as N


def test_spec_is_deterministic_with_three_distinct_targets():
    a = N.sample_needle(random.Random(3), 300)
    b = N.sample_needle(random.Random(3), 300)
    assert a == b and a.num_frames == 1200
    colors = [t.color for t in a.targets] + [a.distractor[0]]
    assert len(set(colors)) == 4 and len({t.shape for t in a.targets}) == 3
    starts = [t.start for t in a.targets]
    assert starts == sorted(starts) and all(t.frames == 8 for t in a.targets)
    assert all(b - a >= 16 for a, b in zip(starts, starts[1:]))   # never two on screen at once
    assert [q["answer"] for q in a.questions()] == [t.shape for t in a.targets]


def test_the_distractor_wanders_on_most_frames():
    spec = N.sample_needle(random.Random(0), 120)
    track = N.distractor_track(spec)
    on = [p for p in track if p is not None]
    assert 0.6 * len(track) <= len(on) < len(track)
    assert len(set(on)) > len(on) // 2      # it moves


def test_frames_show_the_target_only_in_its_two_seconds():
    spec = N.sample_needle(random.Random(1), 30)
    spec.noise = 0
    g = spec.targets[0]
    color = np.array(N.COLORS[g.color], np.uint8)
    for t, want in ((g.start - 1, False), (g.start, True), (g.start + g.frames - 1, True),
                    (g.start + g.frames, False)):
        img = N.render(spec, t)
        assert bool((img == color).all(-1).any()) == want, t
    assert np.array_equal(N.render(spec, 5), N.render(spec, 5))


def test_written_clip_has_its_frames_and_keyframes(tmp_path):
    spec = N.sample_needle(random.Random(2), 15)
    path = N.write_needle_video(str(tmp_path / "n.mp4"), spec)
    with av.open(path) as c:
        s = c.streams.video[0]
        packets = [p for p in c.demux(s) if p.size]
        assert (s.codec_context.width, s.codec_context.height) == (384, 216)
    assert len(packets) == 60 and sum(p.is_keyframe for p in packets) == 8   # frames 0, 8, ..., 56


def test_a_clip_too_short_for_three_events_is_one_line():
    with pytest.raises(ValueError, match=r"^duration_s 5: a needle clip needs at least 12 s"):
        N.sample_needle(random.Random(0), 5)
