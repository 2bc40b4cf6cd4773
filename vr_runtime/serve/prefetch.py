"""A request's video, checked and decoded before its turn on the model and never under the
model's lock (:class:`Prefetch`; the engine runs :meth:`Prefetch.check_and_decode` on a daemon
thread of the request's own). At most ``max_batch + 1`` decoded videos wait at once (the one on
the model and the next batch); a video whose Z the visual cache already holds is not decoded
again; the decode stops between frames once the request is given up."""
from __future__ import annotations

import dataclasses
import threading

from ..video.thumbnails import watch
from .errors import APIError, Skipped, from_exception
from .media import MediaStore, Video
from .schema import Settings


class Prefetch:
    """The media check and the off-lock decode of each request's video, bounded by the clip
    slots (what decoded frames may wait in memory at once)."""

    def __init__(self, vr, media: MediaStore, config):
        self.vr = vr
        self.media = media
        self.config = config
        # Decoded clips waiting for (or on) the model: the one answered and the next batch.
        self._clip_slots = threading.BoundedSemaphore(max(1, config.max_batch) + 1)

    def check_and_decode(self, s: Settings, cancel: threading.Event) -> Video:
        """The media check, then the decode (unless the visual cache holds the frames), stopped
        between frames once ``cancel`` is set (the request was given up)."""
        def should_stop():
            return "the request was given up (timeout, client gone or shutdown)" \
                if cancel.is_set() else None
        video = self.media.resolve(s.video_url)
        if s.thumbnails is not None and video.file is not None:
            # The file's identity and the sampling (as the visual cache's key has them): a
            # request answered from the cache finds the thumbnails an earlier decode left.
            s.thumbnails.bind((video.file.real_path, video.file.identity),
                              (s.num_frames, s.time_window, s.seek, s.fps))
        try:
            cached = getattr(self.vr, "has_frames", None)   # (absent on test doubles)
            if self.config.visual_cache > 0 and cached and s.fps is None and \
                    cached(video.path, s.num_frames, s.time_window, "auto", s.seek) and \
                    (s.thumbnails is None or s.thumbnails.complete()):
                return video
            # (Thumbnails asked for on a video cached by a request that asked for none: its
            # frames are decoded here, off the model's lock, for them; the answer still
            # reuses the cached work.)
            while not self._clip_slots.acquire(timeout=0.05):   # bounds clips held in memory
                if should_stop():
                    raise Skipped(504, "the request was given up while waiting to decode")
            try:
                from ..video.frames import open_frames
                # Checked, indexed and sampled here, and its first prefetch_frames frames
                # decoded; the rest (a long video) stream on the model's turn, through the
                # vision tower a chunk at a time: bounded memory per request however many
                # frames. Decoding stops once the request is given up.
                clip = open_frames(video.path, s.sampling, self.vr.lm.frame_spec,
                                   should_stop=should_stop, limits=self.media.config.limits())
                # Thumbnails (when asked for) are made from these very frames, which the
                # decoding workers hand over: no second decode.
                watch(clip, s.thumbnails)
                clip.prefetch(self.config.prefetch_frames, should_stop)
            except BaseException:
                self._clip_slots.release()
                raise
            return dataclasses.replace(video, clip=clip)
        except BaseException as e:
            self.media.release(video)
            if cancel.is_set() and isinstance(e, Exception):
                # Stopped because the request was given up: its answer is the reason it was
                # given up (503 on a drain, 504 past the deadline), not the decode's error.
                raise Skipped(504, "the request was given up while its video was decoded") \
                    from None
            if isinstance(e, Exception) and not isinstance(e, APIError):
                raise from_exception(e, video.names()) from None
            raise

    def release(self, video: Video) -> None:
        """Let go of a checked video: its pin in the store, its file, its decoded clip's slot."""
        self.media.release(video)
        if video.clip is not None:
            self._clip_slots.release()


__all__ = ["Prefetch"]
