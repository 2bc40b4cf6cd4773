"""Frozen-vision feature cache.

The vision tower is frozen in all three stages, so each video's pre-projector features
(``Backbone.vision_features``: InternVL's tower -> drop CLS -> pixel shuffle, [T, 256, 4*C_vit];
Qwen2.5-VL's tower before the patch merger) are computed once and cached; the projector
(``Backbone.project``) runs inside the training step (it is trainable in Stage 3, frozen before).
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Dict, Iterable, Optional

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from vr_runtime.video.load import load_video


@torch.no_grad()
def vision_features(bb, pixel_values: torch.Tensor, chunk_size: int = 16) -> torch.Tensor:
    """[T, 3, H, W] -> pre-projector features (fp32, on the model's device)."""
    return torch.cat([f.float() for _, f in bb.vision_features(pixel_values, chunk_size)], 0)


def fingerprint(module: torch.nn.Module) -> str:
    """A short hash of a module's weights: cached features are only reused for the same tower."""
    h = hashlib.sha1()
    for name, p in sorted(module.state_dict().items()):
        h.update(name.encode())
        t = p.detach().float().cpu().reshape(-1)
        h.update(repr((tuple(p.shape), float(t.sum()), float(t.abs().sum()))).encode())
    return h.hexdigest()[:12]


class FeatureCache:
    """(video path, T) -> V [T, 256, 4C] (fp16 in RAM, fp16 safetensors on disk when
    ``cache_dir``). ``num_frames`` is the default T; a line with its own frame count (the
    synthetic task v2's ``"num_frames"``) asks for it with ``get(video, T)``."""

    def __init__(self, bb, num_frames: int, cache_dir: Optional[str] = None):
        self.bb = bb
        self.num_frames = num_frames
        self.root = None
        if cache_dir:
            self.root = os.path.join(cache_dir, fingerprint(bb.vision_tower()))
        self.mem: Dict[tuple, torch.Tensor] = {}
        self.unit_times: Dict[tuple, Optional[list]] = {}   # (video, T) -> each row's time (s)

    @property
    def cache_dir(self) -> Optional[str]:
        """The on-disk folder of the default T (``{fingerprint}_T{num_frames}``)."""
        return self._dir(self.num_frames)

    def _dir(self, T: int) -> Optional[str]:
        if not self.root:
            return None
        d = f"{self.root}_T{T}"
        os.makedirs(d, exist_ok=True)
        return d

    def _file(self, video: str, T: int) -> Optional[str]:
        d = self._dir(T)
        if not d:
            return None
        st = os.stat(video)  # a regenerated file at the same path gets a new entry
        key = hashlib.sha1(f"{os.path.abspath(video)}|{st.st_size}|{st.st_mtime_ns}".encode()
                           ).hexdigest()[:16]
        return os.path.join(d, key + ".safetensors")

    def get(self, video: str, num_frames: Optional[int] = None) -> torch.Tensor:
        T = int(num_frames or self.num_frames)
        v = self.mem.get((video, T))
        if v is not None:
            return v
        f = self._file(video, T)
        if f and os.path.isfile(f):
            v = load_file(f)["v"]
            with safe_open(f, framework="pt") as fh:
                meta = (fh.metadata() or {}).get("times")
            self.unit_times[(video, T)] = json.loads(meta) if meta else None
        else:
            spec = self.bb.frame_spec
            # non-square frames are squeezed to size x size (InternVL's resize, no crop)
            clip = load_video(video, num_frames=T, size=spec.size[0], mean=spec.mean,
                              std=spec.std)
            # one row per routing unit (Backbone.units: a frame, or Qwen3-VL's temporal patch)
            pv, _, times = self.bb.units(clip.pixel_values, clip.frame_indices,
                                         clip.timestamps_s)
            self.unit_times[(video, T)] = times
            v = vision_features(self.bb, pv).half().cpu()
            if f:
                save_file({"v": v.contiguous()}, f + ".tmp",
                          metadata={"times": json.dumps(times)} if times is not None else None)
                os.replace(f + ".tmp", f)
        self.mem[(video, T)] = v
        return v

    def times(self, video: str, num_frames: Optional[int] = None) -> Optional[list]:
        """The presentation times (s) of the cached rows of ``video`` (one per routing unit):
        what a backbone with timestamps in its prompt (Qwen3-VL) writes there."""
        self.get(video, num_frames)
        return self.unit_times.get((video, int(num_frames or self.num_frames)))

    def labels(self, frame_labels):
        """Per-frame labels of the T sampled frames -> one per cached row (routing unit)."""
        return self.bb.unit_labels(frame_labels)

    def fill(self, videos: Iterable, progress: bool = True) -> None:
        """Compute every video's features: ``videos`` holds paths (the default T) or
        (path, T) pairs."""
        items = sorted({(v, None) if isinstance(v, str) else (v[0], v[1]) for v in videos},
                       key=lambda x: (x[0], x[1] or 0))
        for v, T in tqdm(items, desc="vision features", disable=not progress, leave=False):
            self.get(v, T)
