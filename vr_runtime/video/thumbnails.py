"""Small JPEG thumbnails of the sampled frames, made from the frames a request decodes anyway.

Why here: the HTML pages (``ask --html``, ``demo --html``, ``serve``'s ``/ui``) show each sampled
frame beside its score and window. Decoding the video a second time for them would double the
request's decoding work; instead a :class:`FileSource` (vr_runtime.video.frames) hands every
frame its decoding workers resize for the vision tower to ``on_frame(source_index, frame)``,
and :meth:`ThumbnailSink.put` keeps a reference to that array (no copy, no work). The
thumbnails are shrunk and encoded when the page asks for them, after the answer, so nothing is
spent on them before the first token; past :data:`HOLD_FRAMES` frames held at once (a long
video) a frame is encoded at once on its worker instead, so at most that many decoded frames are
kept alive. Nothing is decoded for a thumbnail alone.

Size: the side is chosen from the number of sampled frames so that a page stays small (the
demo's 16 frames at 192 px; 256 frames at 128 px), and a frame whose JPEG is over its share of
:data:`PAGE_BYTES` is encoded again at a lower quality. The 448x448 frame the tower reads is
squeezed from the source's shape; the thumbnail takes the source's display aspect back.

:class:`ThumbnailStore` keeps thumbnails by (file, source frame index), bounded in bytes: a
server's later request on the same file, answered from the visual cache without decoding,
finds the thumbnails an earlier request made. Thread-safe (the decoding workers put from
several threads at once)."""
from __future__ import annotations

import base64
import collections
import io
import threading
from typing import Hashable, List, Optional, Sequence

import numpy as np
from PIL import Image

__all__ = ["ThumbnailStore", "ThumbnailSink", "thumbnail_side", "thumbnail", "encode_jpeg",
           "data_url", "watch", "PAGE_BYTES", "HOLD_FRAMES"]

# All of a page's thumbnails together, as JPEG bytes (base64 adds a third): the 3 MB page goal at
# 256 frames, with room for the page's own markup and script.
PAGE_BYTES = 2 * 2**20
QUALITY, LOW_QUALITY = 75, 40
_SIDES = ((64, 192), (128, 160), (256, 128))   # (up to this many frames, longest side in px)
_SMALLEST_SIDE = 96
# Decoded frames a sink keeps until the page asks (0.6 MB each at 448x448: the 256 frames a
# server decodes ahead of a request's turn anyway); frames beyond are encoded as they come.
HOLD_FRAMES = 256
_BILINEAR = getattr(getattr(Image, "Resampling", Image), "BILINEAR")
JPEG_PREFIX = "data:image/jpeg;base64,"


def thumbnail_side(num_frames: int) -> int:
    """The longest side of a thumbnail when ``num_frames`` frames are shown on one page."""
    for most, side in _SIDES:
        if num_frames <= most:
            return side
    return _SMALLEST_SIDE


def _shape(side: int, aspect: float) -> tuple:
    """(width, height) of a ``side``-px thumbnail of display aspect ``aspect`` (width/height)."""
    if aspect >= 1:
        return side, max(1, int(round(side / aspect)))
    return max(1, int(round(side * aspect))), side


def thumbnail(frame: np.ndarray, side: int, aspect: float = 1.0) -> np.ndarray:
    """uint8 [H, W, 3] frame -> uint8 thumbnail, longest side ``side``, ``aspect`` = the shown
    width / height (the decoded frame may be squeezed square). Bilinear with PIL's reducing
    gap: the shrink averages, so the thumbnail is the frame's own colours, not one pixel in
    sixteen."""
    img = Image.fromarray(np.ascontiguousarray(frame, dtype=np.uint8))
    return np.asarray(img.resize(_shape(side, aspect), _BILINEAR, reducing_gap=2.0))


def encode_jpeg(pixels: np.ndarray, quality: int = QUALITY) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=int(quality))
    return buf.getvalue()


def data_url(jpeg: Optional[bytes]) -> Optional[str]:
    """A JPEG as a ``data:`` URL (what the pages put in ``<img src>``); None stays None."""
    return None if jpeg is None else JPEG_PREFIX + base64.b64encode(jpeg).decode("ascii")


class ThumbnailStore:
    """JPEG thumbnails by (file key, source frame index), least recently used dropped first
    once they hold more than ``max_bytes`` (None: no bound; a command's one video)."""

    def __init__(self, max_bytes: Optional[int] = 32 * 2**20, max_samples: int = 1024):
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._items: "collections.OrderedDict[tuple, bytes]" = collections.OrderedDict()
        self._bytes = 0
        # (file key, sampling) -> the frame indices a page showed: whether a later request with
        # the same sampling (a visual-cache hit, which decodes nothing) finds all of them
        self._samples: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()
        self.max_samples = int(max_samples)

    def put(self, key: tuple, jpeg: bytes) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            self._bytes -= len(old) if old is not None else 0
            self._items[key] = jpeg
            self._bytes += len(jpeg)
            while self.max_bytes is not None and self._bytes > self.max_bytes and self._items:
                _, dropped = self._items.popitem(last=False)
                self._bytes -= len(dropped)

    def get(self, key: tuple) -> Optional[bytes]:
        with self._lock:
            jpeg = self._items.get(key)
            if jpeg is not None:
                self._items.move_to_end(key)
            return jpeg

    def mark(self, key: tuple, indices: Sequence[int]) -> None:
        with self._lock:
            self._samples.pop(key, None)
            self._samples[key] = tuple(int(i) for i in indices)
            while len(self._samples) > self.max_samples:
                self._samples.popitem(last=False)

    def marked(self, key: tuple) -> Optional[tuple]:
        with self._lock:
            return self._samples.get(key)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def sink(self, file_key: Hashable = None) -> "ThumbnailSink":
        """The thumbnails of one file (``file_key``: what tells it from any other file; set
        later with :meth:`ThumbnailSink.bind` when it is known only once the file is open)."""
        return ThumbnailSink(self, file_key)


class ThumbnailSink:
    """What a request's frame source calls with each decoded frame, and where its page reads
    the thumbnails back by source frame index."""

    def __init__(self, store: ThumbnailStore, file_key: Hashable = None):
        self.store = store
        self.file_key = file_key
        self.sample: Hashable = None
        self.side = thumbnail_side(1)
        self.aspect = 1.0
        self.budget = PAGE_BYTES
        self._lock = threading.Lock()
        self._pending: dict = {}     # source frame index -> its decoded frame, not yet encoded

    def bind(self, file_key: Hashable, sample: Hashable = None) -> "ThumbnailSink":
        """The file (its identity) and how its frames are sampled (the settings that choose
        them, as the visual cache's key has them)."""
        self.file_key, self.sample = file_key, sample
        return self

    def remember(self, indices: Sequence[int]) -> None:
        """Every thumbnail of ``indices`` was made: a later request with this sampling may
        take them from the store instead of a decode (:meth:`complete`)."""
        self.store.mark((self.file_key, self.sample), indices)

    def complete(self) -> bool:
        """Whether an earlier request with this file and sampling left every thumbnail it
        showed, still held: then a request answered without decoding still has them."""
        indices = self.store.marked((self.file_key, self.sample))
        return indices is not None and all(j is not None for j in self.jpegs(indices))

    def prepare(self, num_frames: int, aspect: float = 1.0) -> "ThumbnailSink":
        """Size the thumbnails for a page of ``num_frames`` frames of display ``aspect``."""
        n = max(1, int(num_frames))
        self.side, self.aspect, self.budget = thumbnail_side(n), float(aspect), PAGE_BYTES // n
        return self

    def put(self, index: int, frame: np.ndarray) -> None:
        """The decoded frame of source frame ``index`` (uint8 [H, W, 3], never written to
        afterwards): kept for :meth:`flush`, or, past :data:`HOLD_FRAMES`, encoded now on the
        caller's (decoding) thread."""
        with self._lock:
            if len(self._pending) < HOLD_FRAMES or int(index) in self._pending:
                self._pending[int(index)] = frame
                return
        self._encode(int(index), frame)

    def _encode(self, index: int, frame: np.ndarray) -> None:
        small = thumbnail(frame, self.side, self.aspect)
        jpeg = encode_jpeg(small)
        if len(jpeg) > self.budget:     # a detailed frame: its share of the page, not more
            jpeg = encode_jpeg(small, LOW_QUALITY)
        self.store.put((self.file_key, index), jpeg)

    def flush(self) -> None:
        """Encode the frames kept so far into the store (and let go of them)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        for index, frame in sorted(pending.items()):
            self._encode(index, frame)

    def jpegs(self, indices: Sequence[int]) -> List[Optional[bytes]]:
        """The JPEG of each source frame index (None where no decode of it was seen)."""
        self.flush()
        return [self.store.get((self.file_key, int(i))) for i in indices]

    def data_urls(self, indices: Sequence[int]) -> List[Optional[str]]:
        return [data_url(j) for j in self.jpegs(indices)]


def watch(source, sink: Optional[ThumbnailSink]) -> None:
    """Have ``source`` (a FileSource, before its first read or prefetch) hand ``sink`` every
    frame it decodes; thumbnails sized for its frame count and shape. ``sink`` None: nothing."""
    if sink is None or not hasattr(source, "display_aspect"):
        return      # a tensor or a decoded clip: no decode to watch
    sink.prepare(len(source), source.display_aspect)
    source.on_frame = sink.put
