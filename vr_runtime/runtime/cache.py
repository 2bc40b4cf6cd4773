"""The visual cache (``cache_visual``): the question-independent state of the last videos, kept
for the next question on the same video -- the frames' indices and times, Z, the Image Router's
state over each Z_t, and (``prefix_cache``) the KV cache of the prompt up to its last visual
token. An LRU of ``size`` videos; a video is keyed by its file (identity and sampling), or by
the tensor or clip object itself."""
from __future__ import annotations

import collections
import pathlib
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

from ..generate import PrefixCache
from ..report import json_window


def video_key(video, num_frames, time_window, decoder="auto", seek="exact") -> tuple:
    """Identity of a video input. Paths: file identity + sampling arguments. Opened sources and
    decoded clips: their file's key. Tensors and clips: the object itself (held by the cache,
    so its id cannot be reused) and, for tensors, its in-place version counter."""
    if isinstance(video, (str, pathlib.Path)):
        # /proc/self/fd/N (a file the server opened once) resolves to the file itself
        p = pathlib.Path(video).resolve()
        try:
            st = p.stat()
            # device, inode and ctime too: a file rewritten in place keeping its size and
            # mtime (cp -p, rsync -t, tar) is a new key
            ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        except OSError:
            ident = None
        tw = tuple(time_window) if time_window is not None else None
        return ("path", str(p), ident, int(num_frames), tw, decoder, seek)
    key = getattr(video, "source_key", None)
    if key is not None:   # opened or decoded from a file: that file's key
        return ("path",) + tuple(key)
    if isinstance(video, torch.Tensor):
        return ("tensor", id(video), video._version, tuple(video.shape))
    return ("clip", id(video))


@dataclass
class PrefixEntry:
    """The visual prefix a video's entry keeps: the plan (JSON windows), the prompt's ids and
    positions up to the last visual token, and their KV cache."""
    plan: list
    ids: torch.Tensor
    pos: Optional[torch.Tensor]
    kv: PrefixCache

    def matches(self, plan: list, ids: torch.Tensor, pos: Optional[torch.Tensor]) -> bool:
        if self.plan != plan or not torch.equal(self.ids, ids):
            return False
        if self.pos is None or pos is None:
            return self.pos is None and pos is None
        return torch.equal(self.pos, pos)


@dataclass
class PrefixUse:
    """A request's use of its video's visual prefix: the cache and whether it was reused."""
    cache: PrefixCache
    status: str                      # "hit" | "miss"

    @property
    def hit(self) -> bool:
        return self.status == "hit"


@dataclass
class VisualEntry:
    """The question-independent state of one video, kept for its next question."""
    key: tuple
    obj: Any = None                  # the tensor or clip itself (a path: None)
    hit: bool = False                # the last lookup found the entry already there
    frames: Any = None               # video.frames.Frames, as opened
    Z: Optional[torch.Tensor] = None  # every unit's vision features
    prefix: Optional[PrefixEntry] = None
    #: scorers' own state over Z (routing.scorers: the Image Router's shadow stack), by key
    scorer_state: dict = field(default_factory=dict)


class VisualCache:
    """Per-video :class:`VisualEntry`, least recently used first out."""

    def __init__(self, size: int = 1):
        self.size = int(size)
        self._entries: "collections.OrderedDict[tuple, dict]" = collections.OrderedDict()

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list:
        """The held entries, least recently used first."""
        return list(self._entries.values())

    def has_z(self, video, num_frames: int, time_window=None, decoder="auto",
              seek="exact") -> bool:
        """Whether Z of ``video`` (a path) at these settings is held, so that answering it
        decodes nothing. A read only; safe from another thread."""
        st = self._entries.get(video_key(video, num_frames, time_window, decoder, seek))
        return st is not None and st.Z is not None

    def state(self, req) -> Optional[VisualEntry]:
        """The request's entry (a new, empty one on a miss: ``hit`` False), or None without
        ``cache_visual``."""
        if not req.cache_visual:
            return None
        key = video_key(req.video, req.num_frames, req.time_window, req.decoder, req.seek)
        obj = None if key[0] == "path" else req.video
        st = self._entries.get(key)
        if st is not None and st.obj is obj:
            self._entries.move_to_end(key)
            st.hit = True
            return st
        st = VisualEntry(key, obj)
        self._entries[key] = st
        while len(self._entries) > max(self.size, 1):
            self._entries.popitem(last=False)
        return st


def visual_prefix(state: VisualEntry, plan: Sequence, ids: torch.Tensor, pos,
                  image_token_id: int) -> Optional[PrefixUse]:
    """The prefix of a prompt of this video (``state``: its cache entry), or None when the
    prompt has no visual token. The prefix runs to the last visual token; it is shared only
    when an earlier question had the same plan and exactly the same ids (system prompt, frame
    labels, placeholders) and positions up to there -- the same Z then gives the same
    embeddings. One entry a video: another plan replaces it."""
    rows = (ids == image_token_id).nonzero()
    if not len(rows) or int(rows[-1]) + 1 >= ids.numel():
        return None
    P = int(rows[-1]) + 1
    key_plan = [json_window(w) for w in plan]
    head, head_pos = ids[:P], None if pos is None else pos[..., :P]
    old = state.prefix
    if old is not None and old.matches(key_plan, head, head_pos):
        return PrefixUse(old.kv, "hit")
    state.prefix = PrefixEntry(key_plan, head.clone(),
                               None if head_pos is None else head_pos.clone(), PrefixCache(P))
    return PrefixUse(state.prefix.kv, "miss")
