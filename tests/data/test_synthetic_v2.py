"""The synthetic task v2 (issue 23): aspect ratios squeezed to the square input, lossy codecs and
noise, moving and resizing targets, 1-3 targets, 8-64 sampled of 16-256 source frames, shape- and
color-sharing distractors, and the one-factor-at-a-time held-out split."""
import dataclasses
import json
import math
import os
import random

import av
import numpy as np
import pytest

from vr_runtime.data import synthetic_videos as syn
from vr_runtime.training.data import read_jsonl
from vr_runtime.video.load import load_video, sample_indices

MEAN = np.array([0.485, 0.456, 0.406])[:, None, None]
STD = np.array([0.229, 0.224, 0.225])[:, None, None]


def spec_with(seed=0, **changes):
    return syn.sample_spec_v2(random.Random(seed), dict(syn.BASE, **changes))


def color_fraction(pixel_values, color, tol=0.12):
    """Fraction of each frame's pixels near ``color`` (pixel_values normalised [T, 3, H, W])."""
    img = pixel_values.numpy() * STD[None] + MEAN[None]
    rgb = np.array(syn.COLORS[color])[None, :, None, None] / 255.0
    return (np.abs(img - rgb).max(1) < tol).mean((1, 2))


@pytest.mark.parametrize("aspect", list(syn.ASPECTS))
def test_each_aspect_is_written_at_its_size_and_squeezed_to_the_square_input(tmp_path, aspect):
    spec = spec_with(aspect=aspect, frames="16/8")
    w, h = syn.ASPECTS[aspect]
    assert spec.frame_size == (w, h) and w % 2 == 0 and h % 2 == 0
    assert syn.render_frame(spec, 0).shape == (h, w, 3)
    path = syn.make_video(str(tmp_path / "v.mp4"), spec)
    with av.open(path) as c:
        st = c.streams.video[0]
        assert (st.codec_context.width, st.codec_context.height) == (w, h)
    clip = load_video(path, num_frames=8)
    assert clip.pixel_values.shape == (8, 3, 448, 448)
    # squeezed, not cropped or letterboxed: a target's bounding box scales by 448/w and 448/h
    color = spec.targets[0][0]
    t = spec.target_labels(color).index(1)
    src = clip.frame_indices[t]
    (shape,) = [s for s in spec.shapes if s.frame == src]
    img = clip.pixel_values[t].numpy() * STD + MEAN
    near = np.abs(img - (np.array(syn.COLORS[color])[:, None, None] / 255.0)).max(0) < 0.15
    ys, xs = np.nonzero(near)
    sx, sy = 448 / w, 448 / h
    assert abs((xs.min() + xs.max()) / 2 - shape.cx * sx) < 4
    assert abs((ys.min() + ys.max()) / 2 - shape.cy * sy) < 4
    assert abs((xs.max() - xs.min()) - 2 * shape.r * sx) < 6
    assert abs((ys.max() - ys.min()) - 2 * shape.r * sy) < 6


@pytest.mark.parametrize("codec", list(syn.CODECS))
def test_each_codec_decodes_back_with_the_labelled_colors(tmp_path, codec):
    spec = spec_with(seed=3, codec=codec, noise=10, frames="16/8")
    assert spec.crf == syn.CODEC_CRF[codec] and spec.noise == 10
    path = syn.make_video(str(tmp_path / "v.mp4"), spec)
    clip = load_video(path, num_frames=8)
    assert clip.codec == {"h264": "h264", "vp9": "vp9", "av1": "av1"}[codec]
    assert clip.num_frames == 8
    for color, _ in spec.targets:
        frac = color_fraction(clip.pixel_values, color, tol=0.2)
        # the target covers > 15% of the frame where labelled, next to nothing elsewhere
        labels = spec.target_labels(color)
        assert all((f > 0.08) == bool(y) for f, y in zip(frac, labels)), (frac, labels)


def test_long_av1_videos_decode_to_their_last_frame(tmp_path):
    # At SVT-AV1 preset 12 this spec (256 frames, three moving targets) wrote a file whose last
    # 12 frames dav1d could not decode; the shipped preset must write it whole.
    spec = spec_with(seed=1, codec="av1", frames="256/16", motion="moving", n_targets=3,
                     distractors="same_shape")
    path = str(tmp_path / "v.mp4")
    syn._write_videos([(path, spec)])
    syn.check_decodes(path, 256)
    assert load_video(path, num_frames=16).num_frames == 16


@pytest.mark.skipif(not hasattr(os, "sched_getscheduler"), reason="Linux scheduling policies")
def test_an_av1_encode_leaves_the_threads_scheduling_as_it_was(tmp_path):
    """SVT-AV1 run as root sets its caller to real-time SCHED_FIFO 99 (the make_video call
    below did so before the fix, under root as CI runs); everything the thread starts later
    would inherit it."""
    before = os.sched_getscheduler(0), os.sched_getparam(0).sched_priority
    syn.make_video(str(tmp_path / "v.mp4"), spec_with(seed=4, codec="av1", frames="8/8"))
    assert (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority) == before


def test_same_scheduling_restores_a_changed_policy():
    if not hasattr(os, "sched_setscheduler") or os.geteuid() != 0:
        pytest.skip("needs Linux and root to raise a policy")
    before = os.sched_getscheduler(0), os.sched_getparam(0).sched_priority
    with syn.same_scheduling():
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    assert (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority) == before


def test_a_video_that_does_not_decode_whole_is_refused_and_not_kept(tmp_path, monkeypatch):
    spec = spec_with(seed=2, frames="32/8")
    short = dataclasses.replace(spec, num_frames=20)   # an encoder that loses 12 frames
    monkeypatch.setattr(syn, "make_video", lambda path, _: syn._encode(
        path, short, "libx264", {"preset": "ultrafast"}))
    path = tmp_path / "v.mp4"
    with pytest.raises(ValueError, match=r"v\.mp4: the encoded video decodes to 20 of 32 frames "
                                         r"\(0 packets failed to decode\); not written"):
        syn._write_videos([(str(path), spec)])
    assert list(tmp_path.iterdir()) == []
    # a torn mp4 (its index is written last) does not open at all
    syn._encode(str(path), spec, "libx264", {"preset": "ultrafast"})
    syn.check_decodes(str(path), 32)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="the encoded video does not open"):
        syn.check_decodes(str(path), 32)


def test_noise_is_deterministic_from_the_seed_and_absent_without_it():
    a, b = spec_with(seed=4, noise=4), spec_with(seed=4, noise=4)
    assert np.array_equal(syn.render_frame(a, 3), syn.render_frame(b, 3))
    clean = spec_with(seed=4)
    assert clean.noise_seed == a.noise_seed and clean.shapes == a.shapes
    # the plain reference: the clean frame plus N(0, 4^2) from the seeded generator, clipped
    z = np.random.default_rng([a.noise_seed, 3]).standard_normal((448, 448, 3), dtype=np.float32)
    ref = syn.render_frame(clean, 3).astype(np.float64) + 4.0 * z
    got = syn.render_frame(a, 3).astype(np.float64)
    assert np.abs(got - np.clip(np.rint(ref), 0, 255)).max() <= 1   # float32 rounding only
    assert 2.0 < (got - syn.render_frame(clean, 3)).std()
    assert not np.array_equal(syn.render_frame(a, 3), syn.render_frame(a, 4))


def test_labels_follow_the_runtimes_sampling_of_256_source_frames(tmp_path):
    spec = spec_with(seed=5, frames="256/8", n_targets=3)
    idx = sample_indices(256, 8, spec.fps)
    assert spec.num_frames == 256 and spec.frames_sampled == 8
    assert spec.sampled_indices() == idx
    path = syn.make_video(str(tmp_path / "v.mp4"), spec)
    clip = load_video(path, num_frames=8)
    assert clip.frame_indices == idx
    qs = syn.questions(spec, random.Random(0))
    for q, (color, shape) in zip(qs, spec.targets):
        on = {s.frame for s in spec.shapes if s.color == color and s.role == "target"}
        assert q["frame_labels"] == [int(i in on) for i in idx]
        assert sum(q["frame_labels"]) >= 1 and len(on) > sum(q["frame_labels"])  # also unsampled
        frac = color_fraction(clip.pixel_values, color)
        assert all((f > 0.05) == bool(y) for f, y in zip(frac, q["frame_labels"]))
    # disjoint: at most one object on screen in any source frame
    frames = [s.frame for s in spec.shapes]
    assert len(frames) == len(set(frames))


def test_moving_targets_move_and_resize_static_ones_do_not():
    for seed in range(10):
        spec = spec_with(seed=seed, motion="moving", frames="64/32")
        side = min(spec.frame_size)
        for color, _ in spec.targets:
            track = [s for s in spec.shapes if s.color == color and s.role == "target"]
            a, b = track[0], track[-1]
            assert math.dist((a.cx, a.cy), (b.cx, b.cy)) >= side / 5 - 1
            assert abs(a.r - b.r) >= 0.15 * a.r - 1
            w, h = spec.frame_size
            assert all(0 <= s.cx - s.r and s.cx + s.r < w and 0 <= s.cy - s.r
                       and s.cy + s.r < h for s in track)
        still = spec_with(seed=seed, frames="64/32")
        for color, _ in still.targets:
            track = {(s.cx, s.cy, s.r) for s in still.shapes if s.color == color}
            assert len(track) == 1


def test_same_color_distractors_are_small_other_shapes_and_unlabelled():
    for seed in range(10):
        spec = spec_with(seed=seed, distractors="same_color")
        side = min(spec.frame_size)
        shapes = dict((c, s) for c, s in spec.targets)
        dis = [s for s in spec.shapes if s.role == "distractor"]
        assert dis and all(s.color in shapes and s.shape != shapes[s.color] for s in dis)
        assert all(s.r <= syn.DISTRACTOR_R[1] * side for s in dis)
        idx = spec.sampled_indices()
        qs = syn.questions(spec, random.Random(seed))
        for q in qs:
            if q["category"] in ("object_shape", "absent_color"):
                assert spec.size_word in q["question"].split()
        for q, (color, _) in zip(qs, spec.targets):
            dis_frames = {s.frame for s in dis if s.color == color}
            for i, y in enumerate(q["frame_labels"]):
                if idx[i] in dis_frames:
                    assert y == 0
        assert any(s.color == c for s in dis for c in shapes)
    # same-shape distractors: target-sized, a target's shape, never a target's color
    spec = spec_with(seed=1, distractors="same_shape")
    tcolors = {c for c, _ in spec.targets}
    dis = [s for s in spec.shapes if s.role == "distractor"]
    assert dis and all(s.color not in tcolors and s.shape in {sh for _, sh in spec.targets}
                       for s in dis)
    assert spec.absent_colors() and not spec.size_word


def test_target_counts_and_question_sets():
    for n in (1, 2, 3):
        spec = spec_with(seed=n, n_targets=n, frames="16/8")
        qs = syn.questions(spec, random.Random(0))
        cats = [q["category"] for q in qs]
        assert cats == ["object_shape"] * n + ["absent_color", "background"]
        assert len({c for c, _ in spec.targets}) == n
        labels = [q["frame_labels"] for q in qs[:n]]
        assert all(len(x) == 8 and sum(x) >= 1 for x in labels)
        assert not any(sum(col) > 1 for col in zip(*labels))     # targets in disjoint frames


def test_bad_factors_are_refused():
    with pytest.raises(ValueError, match="aspect"):
        spec_with(aspect="2:1")
    with pytest.raises(ValueError, match="frames"):
        spec_with(frames="8/16")
    with pytest.raises(ValueError, match="factors"):
        syn.sample_spec_v2(random.Random(0), {"aspect": "1:1"})
    with pytest.raises(ValueError, match="task"):
        syn.write_dataset("/nonexistent", 1, task="v3")


def test_heldout_split_varies_one_factor_at_a_time_and_lines_record_factors(tmp_path,
                                                                            monkeypatch):
    written = []

    def touch(path, spec):   # the layout, not the encoding (tested above): no video written
        written.append(spec.to_dict())
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "wb").close()
        return path
    monkeypatch.setattr(syn, "make_video", touch)
    monkeypatch.setattr(syn, "check_decodes", lambda path, n: None)
    settings = syn.heldout_settings()
    assert settings[0] == ("base", syn.BASE)
    assert len(settings) == 1 + sum(len(v) - 1 for v in syn.FACTORS.values())
    for varies, f in settings[1:]:
        assert [k for k in f if f[k] != syn.BASE[k]] == [varies]
    n = len(settings)
    paths = syn.write_dataset(str(tmp_path), n, seed=1, split="heldout", task="v2")
    lines = [json.loads(x) for x in open(paths["conversations"])]
    seen = {}
    for x in lines:
        assert x["task"] == "v2" and set(x["factors"]) == set(syn.FACTORS)
        S, T = syn.parse_frames(x["factors"]["frames"])
        assert (x["source_frames"], x["num_frames"]) == (S, T)
        if "frame_labels" in x:
            assert len(x["frame_labels"]) == T
        seen[x["video"]] = (x["varies"], x["factors"])
        assert "_v2_" in x["video"]
    assert sorted(seen.values(), key=str) == sorted(settings, key=str)
    ex = read_jsonl(paths["relevance"], "relevance")
    assert {e.frames for e in ex} == {8, 16, 32, 64}
    assert all(e.num_frames == len(e.frame_labels) for e in ex)
    # the training split draws every factor at random
    tr = syn.write_dataset(str(tmp_path), 12, seed=1, split="train", task="v2")
    tl = [json.loads(x) for x in open(tr["policy"])]
    assert all("varies" not in x for x in tl)
    assert len({json.dumps(x["factors"], sort_keys=True) for x in tl}) > 6
    # determinism: the same seed writes the same lines
    first = written[:n]
    again = syn.write_dataset(str(tmp_path / "again"), n, seed=1, split="heldout", task="v2")
    assert open(again["conversations"]).read() == open(paths["conversations"]).read()
    assert written[-n:] == first


def test_footage_split_is_the_combined_setting_and_synth_writes_it(tmp_path, monkeypatch):
    assert [k for k in syn.FOOTAGE if syn.FOOTAGE[k] == syn.BASE[k]] == ["distractors"]
    from vr_tiny.__main__ import main
    assert main(["synth", "--out", str(tmp_path / "v1"), "--train", "0", "--heldout", "0",
                 "--footage", "2"]) == 2                       # task v1 has no footage split
    assert main(["synth", "--task", "v2", "--out", str(tmp_path), "--train", "0",
                 "--heldout", "0", "--footage", "2"]) == 0
    lines = [json.loads(x) for x in open(tmp_path / "footage_conversations.jsonl")]
    assert {x["video"] for x in lines} == {"footage/footage_v2_00000.mp4",
                                           "footage/footage_v2_00001.mp4"}
    assert all(x["varies"] == "footage" and x["factors"] == syn.FOOTAGE for x in lines)
    assert all(x["num_frames"] == 32 and x["source_frames"] == 64 for x in lines)
    for v in {x["video"] for x in lines}:
        with av.open(str(tmp_path / v)) as c:
            st = c.streams.video[0]
            assert (st.codec_context.name, st.width, st.height, st.frames) == ("vp9", 640, 360, 64)
    # routing-eval's per-factor rows: none (every factor varies at once), the overall row only
    from vr_tiny.routing_eval import factor_groups
    assert all(factor_groups(x) == [] for x in lines)


def test_v1_stays_the_default_and_unchanged():
    a = syn.sample_spec(random.Random(3))
    assert a.frame_size == (448, 448) and a.codec == "h264" and a.crf == 12
    assert a.frames_sampled == 16 and not a.factors
    qs = syn.questions(a, random.Random(3))
    for q, (color, _) in zip(qs, a.targets):
        assert q["frame_labels"] == [int(t in a.frames_with(color)) for t in range(16)]


def test_rendering_paints_exactly_the_full_frame_masks():
    """render_frame paints each shape within its bounding box: the same pixels as the plain
    full-frame ``shape_mask`` (every shape kind, frames of every aspect, shapes at the edges)."""
    for seed in range(12):
        spec = syn.sample_spec_v2(random.Random(seed))
        spec.noise = 0.0
        w, h = spec.frame_size
        for t in sorted({s.frame for s in spec.shapes})[:6]:
            ref = np.empty((h, w, 3), np.uint8)
            ref[:] = syn.BACKGROUNDS[spec.background]
            for s in spec.shapes:
                if s.frame == t:
                    ref[syn.shape_mask(s.shape, s.cx, s.cy, s.r, w, h)] = syn.COLORS[s.color]
            assert np.array_equal(syn.render_frame(spec, t), ref), (seed, t)
    edge = syn.VideoSpec(num_frames=1, size=64, shapes=[syn.Shape(0, "circle", "red", 2, 60, 9)])
    ref = np.zeros((64, 64, 3), np.uint8)
    ref[syn.shape_mask("circle", 2, 60, 9, 64)] = syn.COLORS["red"]
    assert np.array_equal(syn.render_frame(edge, 0), ref)
