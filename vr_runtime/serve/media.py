"""Where a request's video comes from, and whether the server may use it.

``file://`` URLs must resolve (``..`` and symlinks followed) to a file inside ``--media-dir``;
anything else is a 403, whether or not it exists, so the server never says what lies outside.
``data:video/...;base64,`` payloads are decoded under a size cap and stored once under a name
made from their SHA-256, so sending the same clip again is the same file to the runtime (and its
visual cache). ``http(s)://`` URLs are refused unless the server was started with
``--allow-remote-media``; then they are downloaded (size cap, timeout) into the same store.

Every accepted video is opened once (``vr_runtime.video.load.VideoFile``: a regular file, checked with
``fstat`` on the open descriptor; a FIFO, device or socket is a 422 before any read) and from then
on read only through that descriptor (``/proc/self/fd/N``), so a folder swapped for a symlink after
the check cannot redirect it; the descriptor's own path must lie inside ``--media-dir`` too. It is
indexed by ``vr_runtime.video.load.open_video`` before it waits for the model, so a file that is not a
usable video is a 422 at once, with the message ``videorouter ask`` prints; a video longer than
``--max-video-seconds`` (declared, or counted while indexing when the container declares
nothing) or with frames over ``--max-frame-pixels`` is a 422 too.

The upload store is a folder ``videorouter-serve-<pid>-*`` in the temporary directory, removed at
exit; one left by a process that no longer runs (``kill -9``) is removed when the next server
starts.
"""
from __future__ import annotations

import atexit
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

from ..errors import VideoError
from .errors import APIError, from_exception

_DATA_URL = re.compile(r"^data:(?P<mime>[^;,]*)((?:;[^;,]*)*);base64,", re.IGNORECASE)
_SUFFIX = {"video/mp4": ".mp4", "video/webm": ".webm", "video/x-matroska": ".mkv",
           "video/quicktime": ".mov", "video/x-msvideo": ".avi", "video/mpeg": ".mpg"}
DATA_LABEL = "video_url (data: URL)"
# What the /ui listing shows of the media directory (any file may still be asked for by URL).
VIDEO_SUFFIXES = (".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".mpg", ".mpeg", ".ts",
                  ".mts", ".m2ts", ".flv", ".wmv", ".3gp", ".ogv", ".gif")


@dataclass(frozen=True)
class MediaConfig:
    media_dir: pathlib.Path
    max_video_bytes: int = 64 * 2**20        # a data: or downloaded video
    max_video_seconds: Optional[float] = 4 * 3600.0
    allow_remote: bool = False
    remote_timeout_s: float = 30.0
    max_stored: int = 32                     # data:/downloaded videos kept on disk (LRU)
    max_frame_pixels: int = 7680 * 4320      # --max-frame-pixels (8K UHD)

    def limits(self):
        from ..video.decoders import Limits   # (here: it imports numpy)
        return Limits(max_frame_pixels=self.max_frame_pixels,
                      max_seconds=self.max_video_seconds)


STORE_PREFIX = "videorouter-serve-"


@dataclass(frozen=True)
class Video:
    """A usable video: ``path`` for the runtime (``/proc/self/fd/N`` of the file opened once),
    ``label`` for messages (what the client sent)."""
    path: str
    label: str
    stored: bool    # in the upload store (pinned until release())
    file: object = None             # the open vr_runtime.video.load.VideoFile (closed by release())
    shown: Optional[str] = None     # how messages name the file (its real path, or the label)
    clip: object = None             # its frames, decoded before the model's turn (the engine)

    def names(self) -> Optional[dict]:
        """Server-side text -> what messages show (for ``from_exception``)."""
        shown = self.shown or (self.label if self.stored else None)
        return {self.path: shown} if shown and shown != self.path else None


class MediaStore:
    """Resolves video URLs to checked local files. Thread-safe."""

    def __init__(self, config: MediaConfig):
        root = pathlib.Path(config.media_dir)
        if not root.is_dir():
            raise ValueError(f"--media-dir {str(root)!r}: no such directory")
        self.config = config
        self.root = root.resolve()
        sweep_stores()
        self._dir = pathlib.Path(tempfile.mkdtemp(prefix=f"{STORE_PREFIX}{os.getpid()}-"))
        atexit.register(self.close)    # however the process ends short of kill -9
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
            video = self._open_local(url)
        elif scheme == "data":
            video = self._store_data(url)
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

    def _open_local(self, url: str) -> Video:
        """Open the file once and check what was opened: a regular file (a FIFO, device or
        socket is refused before any read), whose descriptor's own path lies inside the media
        directory (a folder swapped for a symlink between the check and the open is a 403)."""
        from ..video.load import VideoFile   # (here: it imports torch)
        real = self._local(url)
        try:
            f = VideoFile(real)
        except VideoError as e:
            raise from_exception(e) from None
        opened = pathlib.Path(f.real_path)
        if opened != self.root and self.root not in opened.parents:
            f.close()
            raise APIError(403, f"video_url: {_short(url)!r} is outside the server's media "
                           f"directory", "video_url")
        return Video(f.source, url, False, f, real)

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

    def _check_data(self, url: str) -> None:
        m = _DATA_URL.match(url)
        if not m:
            raise APIError(400, "video_url: a data: URL must be data:video/<type>;base64,<data>",
                           "video_url")
        mime = m.group("mime").lower()
        if not (mime.startswith("video/") or mime == "application/octet-stream"):
            raise APIError(400, f"video_url: data: URL of type {mime or 'text/plain'!r}; "
                           f"expected video/...", "video_url")
        if (len(url) - m.end()) * 3 // 4 > self.config.max_video_bytes:
            raise APIError(413, f"video_url: the data: video is over {_mib(self.config.max_video_bytes)} "
                           f"(the server's --max-video-mb)", "video_url")

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

    def _store_data(self, url: str) -> Video:
        """A data: URL decoded straight to the store, a block at a time (hashed on the way):
        no decoded copy of the whole video is held in memory."""
        m = _DATA_URL.match(url)
        self._check_data(url)
        tmp = self._dir / f".upload.{threading.get_ident()}.{id(url)}.part"
        h = hashlib.sha256()
        block = 4 * 2**20     # base64 characters per step: a multiple of 4
        try:
            with open(tmp, "wb") as out:
                for i in range(m.end(), len(url), block):
                    try:
                        part = base64.b64decode(url[i:i + block], validate=True)
                    except (binascii.Error, ValueError):
                        raise APIError(400, "video_url: the data: URL is not valid base64",
                                       "video_url") from None
                    h.update(part)
                    out.write(part)
            return self._commit(tmp, h, m.group("mime"), DATA_LABEL)
        finally:
            tmp.unlink(missing_ok=True)

    def _store(self, data: bytes, mime: str, label: str) -> Video:
        tmp = self._dir / f".download.{threading.get_ident()}.{id(data)}.part"
        try:
            tmp.write_bytes(data)
            return self._commit(tmp, hashlib.sha256(data), mime, label)
        finally:
            tmp.unlink(missing_ok=True)

    def _commit(self, tmp: pathlib.Path, h, mime: str, label: str) -> Video:
        """The written upload ``tmp`` takes its content's name (the same clip sent again is the
        same file, and keeps its identity: the runtime's cache key), pinned and opened."""
        from ..video.load import VideoFile   # (here: it imports torch)
        if tmp.stat().st_size == 0:
            raise APIError(422, f"{label}: the video is empty (0 bytes)", "video_url")
        name = h.hexdigest()[:32] + _SUFFIX.get(mime.lower(), ".mp4")
        path = self._dir / name
        with self._lock:
            if not path.exists():
                # renamed into place whole: a reader never sees half a file
                os.replace(tmp, path)
            self._lru[name] = None
            self._lru.move_to_end(name)
            self._pins[name] += 1
            self._evict()
        try:
            f = VideoFile(str(path))
        except VideoError as e:
            self.release(Video(str(path), label, True))
            raise from_exception(e, {str(path): label}) from None
        return Video(f.source, label, True, f, label)

    def _evict(self) -> None:
        for name in list(self._lru):
            if len(self._lru) <= self.config.max_stored:
                break
            if self._pins.get(name):
                continue  # a queued request still needs it
            del self._lru[name]
            (self._dir / name).unlink(missing_ok=True)

    def release(self, video: Video) -> None:
        if video.file is not None:
            video.file.close()
        if not video.stored:
            return
        name = os.path.basename(video.file.path if video.file is not None else video.path)
        with self._lock:
            self._pins[name] -= 1
            if self._pins[name] <= 0:
                del self._pins[name]
            self._evict()

    def listing(self, limit: int = 1000) -> tuple:
        """(videos, truncated): the video files under the media directory that a request's
        ``file://`` URL may name, each ``{"name": path relative to it, "url": its file:// URL}``,
        sorted, at most ``limit``. Confined exactly as a request is: every URL goes through the
        check a request's URL does (:meth:`_local`), so a symlink out of the directory is left
        out; only regular files are listed (checked with ``stat``: nothing is opened)."""
        videos = []
        for folder, dirs, files in os.walk(self.root, followlinks=False):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(files):
                if name.startswith(".") or not name.lower().endswith(VIDEO_SUFFIXES):
                    continue
                url = pathlib.Path(folder, name).as_uri()
                try:
                    real = self._local(url)
                except APIError:
                    continue
                if not os.path.isfile(real):
                    continue
                if len(videos) >= limit:
                    return videos, True
                videos.append({"name": os.path.relpath(os.path.join(folder, name), self.root),
                               "url": url})
        return videos, False

    def stored_count(self) -> int:
        with self._lock:
            return len(self._lru)

    # ------------------------------------------------------------------ checks
    def _check_video(self, video: Video) -> None:
        """``open_video`` on the opened file (the runtime's own checks and messages) with the
        server's caps: the frame size, and the duration declared or counted while indexing."""
        from ..video.load import open_video   # (here: it imports torch)
        try:
            info = open_video(video.shown or video.path, file=video.file,
                              limits=self.config.limits())
        except Exception as e:
            raise from_exception(e, video.names()) from None
        cap = self.config.max_video_seconds
        seconds = max(info.declared_s or 0.0, info.duration_s)
        if cap is not None and seconds > cap:
            raise APIError(422, f"{video.shown or video.path}: the video lasts {seconds:.1f} s; "
                           f"this server accepts at most {cap:g} s (--max-video-seconds)",
                           "video_url")


def sweep_stores(tmpdir: Optional[str] = None) -> list:
    """Remove upload stores (``videorouter-serve-<pid>-*``) whose process no longer runs: what a
    ``kill -9`` left. Returns the folders removed."""
    root = tmpdir or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        m = re.match(rf"^{STORE_PREFIX}(\d+)-", name)
        if not m or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
            continue
        path = os.path.join(root, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:     # EPERM: it runs, as another user
        return True
    return True


def _short(url: str, n: int = 80) -> str:
    return url if len(url) <= n else url[:n] + "..."


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"
