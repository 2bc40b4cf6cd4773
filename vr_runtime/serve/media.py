"""Where a request's video comes from, and whether the server may use it.

``file://`` URLs must resolve (``..`` and symlinks followed) to a file inside ``--media-dir``;
anything else is a 403, whether or not it exists, so the server never says what lies outside.
``data:video/...;base64,`` payloads are decoded under a size cap and stored once under a name
made from their SHA-256, so sending the same clip again is the same file to the runtime (and its
visual cache). ``http(s)://`` URLs are refused unless the server was started with
``--allow-remote-media``; then they are downloaded (size cap, timeout) into the same store.

Every accepted video is opened by ``vr_runtime.video.open_video`` before it waits for the model,
so a file that is not a usable video is a 422 at once, with the message ``videorouter ask``
prints; a video longer than ``--max-video-seconds`` is a 422 too.
"""
from __future__ import annotations

import base64
import binascii
import collections
import hashlib
import os
import pathlib
import re
import shutil
import tempfile
import threading
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Dict, Optional

from .errors import APIError

_DATA_URL = re.compile(r"^data:(?P<mime>[^;,]*)((?:;[^;,]*)*);base64,", re.IGNORECASE)
_SUFFIX = {"video/mp4": ".mp4", "video/webm": ".webm", "video/x-matroska": ".mkv",
           "video/quicktime": ".mov", "video/x-msvideo": ".avi", "video/mpeg": ".mpg"}
DATA_LABEL = "video_url (data: URL)"


@dataclass(frozen=True)
class MediaConfig:
    media_dir: pathlib.Path
    max_video_bytes: int = 64 * 2**20        # a data: or downloaded video
    max_video_seconds: Optional[float] = 4 * 3600.0
    allow_remote: bool = False
    remote_timeout_s: float = 30.0
    max_stored: int = 32                     # data:/downloaded videos kept on disk (LRU)


@dataclass(frozen=True)
class Video:
    """A usable video: ``path`` for the runtime, ``label`` for messages (what the client sent)."""
    path: str
    label: str
    stored: bool    # in the upload store (pinned until release())


class MediaStore:
    """Resolves video URLs to checked local files. Thread-safe."""

    def __init__(self, config: MediaConfig):
        root = pathlib.Path(config.media_dir)
        if not root.is_dir():
            raise ValueError(f"--media-dir {str(root)!r}: no such directory")
        self.config = config
        self.root = root.resolve()
        self._dir = pathlib.Path(tempfile.mkdtemp(prefix="videorouter-serve-"))
        self._lock = threading.Lock()
        self._lru: "collections.OrderedDict[str, None]" = collections.OrderedDict()
        self._pins: Dict[str, int] = collections.Counter()

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)

    # ------------------------------------------------------------------ resolution
    def resolve(self, url: str) -> Video:
        """Check ``url`` and return the video (stored ones pinned: call :meth:`release`)."""
        if not isinstance(url, str) or not url:
            raise APIError(400, "video_url.url: empty", "video_url")
        scheme = url.split(":", 1)[0].lower() if ":" in url else ""
        if scheme == "file":
            video = Video(self._local(url), url, False)
        elif scheme == "data":
            video = self._store(self._decode_data(url), _DATA_URL.match(url).group("mime"),
                                DATA_LABEL)
        elif scheme in ("http", "https"):
            if not self.config.allow_remote:
                raise APIError(403, "remote video URLs are disabled on this server; send a "
                               "file:// path under its media directory or a data:video/...;base64 "
                               "URL (or start the server with --allow-remote-media)", "video_url")
            data, mime = self._download(url)
            video = self._store(data, mime, url)
        else:
            raise APIError(400, f"video_url: unsupported URL {_short(url)!r}; expected file://, "
                           f"data:video/...;base64, or (if enabled) http(s)://", "video_url")
        try:
            self._check_video(video)
        except BaseException:
            self.release(video)
            raise
        return video

    def _local(self, url: str) -> str:
        parts = urllib.parse.urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise APIError(400, f"video_url: {_short(url)!r}: a file:// URL names a local path "
                           f"(file:///abs/path.mp4), not host {parts.netloc!r}", "video_url")
        path = urllib.parse.unquote(parts.path)
        if not path or "\x00" in path or not os.path.isabs(path):
            raise APIError(400, f"video_url: {_short(url)!r}: expected an absolute path, "
                           f"file:///abs/path.mp4", "video_url")
        real = pathlib.Path(os.path.realpath(path))
        if real != self.root and self.root not in real.parents:
            raise APIError(403, f"video_url: {_short(url)!r} is outside the server's media "
                           f"directory", "video_url")
        return str(real)

    def _decode_data(self, url: str) -> bytes:
        m = _DATA_URL.match(url)
        if not m:
            raise APIError(400, "video_url: a data: URL must be data:video/<type>;base64,<data>",
                           "video_url")
        mime = m.group("mime").lower()
        if not (mime.startswith("video/") or mime == "application/octet-stream"):
            raise APIError(400, f"video_url: data: URL of type {mime or 'text/plain'!r}; "
                           f"expected video/...", "video_url")
        payload = url[m.end():]
        if len(payload) * 3 // 4 > self.config.max_video_bytes:
            raise APIError(413, f"video_url: the data: video is over {_mib(self.config.max_video_bytes)} "
                           f"(the server's --max-video-mb)", "video_url")
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise APIError(400, "video_url: the data: URL is not valid base64", "video_url") from None

    def _download(self, url: str):
        cap = self.config.max_video_bytes
        req = urllib.request.Request(url, headers={"User-Agent": "videorouter-serve"})
        try:
            with urllib.request.urlopen(req, timeout=self.config.remote_timeout_s) as r:
                mime = (r.headers.get_content_type() or "").lower()
                data = r.read(cap + 1)
        except Exception as e:  # urllib's URLError, HTTPError, timeouts
            raise APIError(422, f"video_url: cannot download {_short(url)!r} "
                           f"({type(e).__name__}: {e})", "video_url") from None
        if len(data) > cap:
            raise APIError(413, f"video_url: {_short(url)!r} is over {_mib(cap)} (the server's "
                           f"--max-video-mb)", "video_url")
        return data, mime

    def _store(self, data: bytes, mime: str, label: str) -> Video:
        if not data:
            raise APIError(422, f"{label}: the video is empty (0 bytes)", "video_url")
        name = hashlib.sha256(data).hexdigest()[:32] + _SUFFIX.get(mime.lower(), ".mp4")
        path = self._dir / name
        with self._lock:
            if not path.exists():
                # Written under a temporary name then renamed: a reader never sees half a file,
                # and an unchanged clip keeps its mtime (the runtime's cache key).
                tmp = self._dir / f".{name}.{threading.get_ident()}.part"
                tmp.write_bytes(data)
                os.replace(tmp, path)
            self._lru[name] = None
            self._lru.move_to_end(name)
            self._pins[name] += 1
            self._evict()
        return Video(str(path), label, True)

    def _evict(self) -> None:
        for name in list(self._lru):
            if len(self._lru) <= self.config.max_stored:
                break
            if self._pins.get(name):
                continue  # a queued request still needs it
            del self._lru[name]
            (self._dir / name).unlink(missing_ok=True)

    def release(self, video: Video) -> None:
        if not video.stored:
            return
        name = os.path.basename(video.path)
        with self._lock:
            self._pins[name] -= 1
            if self._pins[name] <= 0:
                del self._pins[name]
            self._evict()

    def stored_count(self) -> int:
        with self._lock:
            return len(self._lru)

    # ------------------------------------------------------------------ checks
    def _check_video(self, video: Video) -> None:
        """``open_video`` (the runtime's own checks and messages) and the duration cap."""
        from ..video import open_video
        from .errors import from_exception
        try:
            open_video(video.path)
        except Exception as e:
            raise from_exception(e, {video.path: video.label} if video.stored else None) from None
        cap = self.config.max_video_seconds
        if cap is not None:
            seconds = probe_seconds(video.path)
            if seconds is not None and seconds > cap:
                raise APIError(422, f"{video.label if video.stored else video.path}: the video "
                               f"lasts {seconds:.1f} s; this server accepts at most {cap:g} s "
                               f"(--max-video-seconds)", "video_url")


def probe_seconds(path: str) -> Optional[float]:
    """The duration the container declares (PyAV, no decoding), or None if it declares none."""
    try:
        import av
        with av.open(path, metadata_errors="ignore") as c:
            if c.duration and c.duration > 0:
                return c.duration / 1e6
            s = c.streams.video[0]
            if s.duration and s.time_base:
                return float(s.duration * s.time_base)
    except Exception:
        return None
    return None


def _short(url: str, n: int = 80) -> str:
    return url if len(url) <= n else url[:n] + "..."


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"
