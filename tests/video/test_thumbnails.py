"""Thumbnails from the frames a request decodes anyway (vr_runtime.video.thumbnails): handed over
by the decoding workers, encoded when the page asks, equal (within JPEG's error) to the decoded
frames shrunk, sized to keep a page small, and never a second decode."""
import io
import pathlib

import numpy as np
import pytest
from PIL import Image

from vr_runtime.video import stream
from vr_runtime.video.frames import open_frames
from vr_runtime.video.sampling import Sampling
from vr_runtime.video.thumbnails import (PAGE_BYTES, ThumbnailStore, data_url, thumbnail,
                                         thumbnail_side, watch)

SAMPLE = pathlib.Path(__file__).resolve().parents[2] / "vr_runtime" / "assets" / "sample.mp4"


def _pixels(jpeg: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"), dtype=np.float32)


def test_sides_shrink_with_the_frame_count():
    assert [thumbnail_side(n) for n in (1, 16, 64, 65, 128, 256, 257, 2048)] == \
        [192, 192, 192, 160, 160, 128, 96, 96]


def test_thumbnail_restores_the_display_aspect():
    frame = np.zeros((448, 448, 3), np.uint8)
    assert thumbnail(frame, 128, 16 / 9).shape == (72, 128, 3)
    assert thumbnail(frame, 128, 9 / 16).shape == (128, 72, 3)
    assert thumbnail(frame, 96).shape == (96, 96, 3)


def test_the_store_drops_the_least_recent_past_its_bound():
    store = ThumbnailStore(max_bytes=10)
    store.put(("a", 0), b"12345")
    store.put(("a", 1), b"12345")
    assert store.get(("a", 0)) == b"12345"       # now the most recent
    store.put(("a", 2), b"123")
    assert store.get(("a", 1)) is None and store.get(("a", 0)) and store.get(("a", 2))
    assert store.nbytes == 8 and len(store) == 2


def test_sinks_of_two_files_do_not_mix():
    store = ThumbnailStore()
    a, b = store.sink("file-a"), store.sink("file-b")
    frame = np.full((448, 448, 3), 200, np.uint8)
    a.put(3, frame)
    assert a.jpegs([3, 4])[1] is None and a.jpegs([3])[0] is not None
    assert b.jpegs([3]) == [None]
    assert a.data_urls([3])[0].startswith("data:image/jpeg;base64,")
    assert data_url(None) is None


def test_a_sample_is_complete_once_every_thumbnail_it_showed_is_held():
    store = ThumbnailStore(max_bytes=4000)
    sink = store.sink().bind("file", (8, None, "exact", None))
    assert not sink.complete()
    frame = np.full((448, 448, 3), 90, np.uint8)
    for i in (0, 5):
        sink.put(i, frame)
    sink.remember([0, 5])
    assert sink.complete()
    other = store.sink().bind("file", (16, None, "exact", None))   # another sampling
    assert not other.complete()
    another = store.sink("another file")
    for i in range(10, 20):      # the store's bound drops frame 0's thumbnail
        another.put(i, frame)
    another.flush()
    assert not sink.complete()


def test_frames_wait_unencoded_until_the_page_asks_up_to_a_bound(monkeypatch):
    """put() only keeps the decoder's array (nothing spent before the first token); past
    HOLD_FRAMES kept at once a frame is encoded as it comes, so a long video's frames are not
    all held."""
    from vr_runtime.video import thumbnails
    monkeypatch.setattr(thumbnails, "HOLD_FRAMES", 3)
    store = ThumbnailStore(None)
    sink = store.sink("f")
    frame = np.full((448, 448, 3), 30, np.uint8)
    for i in range(5):
        sink.put(i, frame)
    assert len(store) == 2 and len(sink._pending) == 3       # frames 3 and 4 encoded at once
    assert all(j is not None for j in sink.jpegs(range(5)))   # the rest encoded when asked
    assert len(store) == 5 and not sink._pending


def test_a_detailed_frame_keeps_to_its_share_of_the_page():
    """Noise is JPEG's worst case: 256 noisy frames still fit the page's thumbnail budget."""
    sink = ThumbnailStore(None).sink("noise").prepare(256)
    rng = np.random.default_rng(0)
    for i in range(256):
        sink.put(i, rng.integers(0, 256, (448, 448, 3), dtype=np.uint8))
    sizes = [len(j) for j in sink.jpegs(range(256))]
    assert sum(sizes) <= PAGE_BYTES and max(sizes) <= PAGE_BYTES // 256


def test_thumbnails_are_the_decoded_frames_and_no_second_decode(monkeypatch):
    """The source hands its decoding workers' frames to the sink: one thumbnail per sampled
    frame, each the frame the vision stage reads (within JPEG's error), and the video decoded
    exactly as often as without thumbnails."""
    calls = []
    real = stream.decode_frames

    def counting(info, indices, *a, **kw):
        calls.append(list(indices))
        return real(info, indices, *a, **kw)
    monkeypatch.setattr(stream, "decode_frames", counting)

    plain = open_frames(str(SAMPLE), Sampling(16))
    for _ in plain.chunks(range(16), 8):
        pass
    decoded = sorted(i for c in calls for i in c)
    calls.clear()

    src = open_frames(str(SAMPLE), Sampling(16))
    sink = ThumbnailStore(None).sink("sample")
    watch(src, sink)
    pixels = [x for x in src.chunks(range(16), 8)]
    assert sorted(i for c in calls for i in c) == decoded    # the same decode, once
    jpegs = sink.jpegs(src.indices)
    assert all(j is not None for j in jpegs)

    # the frames themselves, decoded again here (uint8, as the tower gets them before
    # normalising) and shrunk the same way
    with src.stream(range(16)) as s:
        frames = [s.take(r) for r in range(16)]
    diffs = [np.abs(_pixels(j) - thumbnail(f, sink.side, sink.aspect).astype(np.float32)).mean()
             for j, f in zip(jpegs, frames)]
    assert max(diffs) < 4.0, diffs
    # a thumbnail is its own frame's: the red circle's (frame 6) is not the empty frame 0's
    assert np.abs(_pixels(jpegs[6]) - _pixels(jpegs[0])).mean() > 10
    assert len(pixels) == 2


def test_watch_leaves_a_tensor_source_alone():
    import torch
    from vr_runtime.video.frames import TensorSource
    src = TensorSource(torch.zeros(2, 3, 8, 8))
    watch(src, ThumbnailStore(None).sink())
    assert getattr(src, "on_frame", None) is None
    watch(open_frames(str(SAMPLE), Sampling(4)), None)   # no sink: nothing to do


def test_a_failing_thumbnail_fails_the_decode_loudly():
    """A sink that raises is a bug, not something to drop silently: the stream reports it as
    a decoding failure naming the file."""
    from vr_runtime.errors import VideoError
    src = open_frames(str(SAMPLE), Sampling(4))

    def broken(index, frame):
        raise RuntimeError("thumbnail bug")
    src.on_frame = broken
    with pytest.raises(VideoError, match="sample.mp4"):
        list(src.chunks(range(4), 4))
