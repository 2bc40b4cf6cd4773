"""Video -> frames: probing a file (:mod:`.probe`) and decoding it (:mod:`.decoders`, which
chooses between :mod:`.pyav_decoder` and :mod:`.decord_decoder`), then sampling, resizing and
normalising the frames a request asks for (:mod:`.load`).

``from vr_runtime.video import load_video`` keeps working: the loader's public names are read
from :mod:`.load` on first use, so importing the decoders alone does not import torch."""

_LOAD = ("VideoClip", "VideoFile", "load_video", "prefetch_video", "open_video", "sample_indices",
         "sample_window", "preprocess_frames", "estimate_memory", "available_memory",
         "IMAGENET_MEAN", "IMAGENET_STD", "MEMORY_ENV")

__all__ = list(_LOAD)


def __getattr__(name):
    if name in _LOAD:
        from . import load
        return getattr(load, name)
    raise AttributeError(f"module 'vr_runtime.video' has no attribute {name!r}")
