"""torchcodec's decoding path: NVDEC on a CUDA device (the GPU's hardware video decoder), so
decoding leaves the host's cores to the rest of the pipeline and the frames are born on the GPU.

Optional and imported on first use: the Linux wheel on PyPI is built against CUDA PyTorch
(it needs ``libtorch_cuda`` and ``libnvrtc``) and against the system's FFmpeg shared libraries
(4 to 8), which it uses to demux; a CPU-only PyTorch cannot load it. ``decoder="auto"`` picks
it only on a CUDA device for the codecs NVDEC decodes (``NVDEC_CODECS``); on CPU ``auto``
keeps PyAV and decord (docs/video-input.md lists the wheels and how to carry them).

torchcodec (0.16 and later) applies the rotation metadata while decoding and resizes inside
the decoder (bilinear, antialiased): the frames are upright at the display size, and
``scale`` (the coded frame's width, height, as for the other decoders) is turned to the
display orientation before it is asked for. Older versions that do not rotate get
:func:`_orient`, as PyAV's frames do.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from ..errors import VideoError
from .probe import OnFrame, VideoIndex, _check_cancel, _clean_reason, _orient

__all__ = ["NVDEC_CODECS", "decode_torchcodec", "torchcodec_module", "nvdec_available"]

# What NVDEC decodes on the GPUs this project runs on (Ampere, Hopper: H.264, HEVC, VP9, AV1;
# 4:2:0, 8 and 10 bits). Other codecs (and 4:2:2 / 4:4:4 sources, which NVDEC refuses) stay
# with the CPU decoders under ``auto``.
NVDEC_CODECS = frozenset({"h264", "hevc", "vp9", "av1"})

# Frames asked for per call: a batch is one tensor on the device (a few MB at the decode size)
# and one call amortises the Python overhead without holding the whole clip.
_CHUNK = 16


def torchcodec_module():
    """torchcodec's decoders module, or None where it is not installed or does not load (a
    CPU-only PyTorch, FFmpeg's shared libraries missing)."""
    try:
        from torchcodec import decoders
        return decoders
    except Exception:  # ImportError, or OSError/RuntimeError from its native libraries
        return None


def nvdec_available(codec: str) -> bool:
    """Whether ``auto`` may hand this codec to NVDEC here: CUDA, torchcodec, a codec NVDEC has."""
    if codec not in NVDEC_CODECS:
        return False
    import torch
    return torch.cuda.is_available() and torchcodec_module() is not None


def _display_hw(info: VideoIndex, scale: Tuple[int, int]) -> Tuple[int, int]:
    """``scale`` (coded width, height) as (height, width) of the displayed frame."""
    w, h = scale
    return (w, h) if info.rotation % 180 == 90 else (h, w)


def _open(mod, info: VideoIndex, scale: Tuple[int, int], device: str):
    from torchcodec.transforms import Resize
    kw = dict(dimension_order="NHWC", device=device, seek_mode="exact")
    if device == "cpu":
        kw["num_ffmpeg_threads"] = 0          # FFmpeg picks (the CPU row of the benchmark)
    dec = mod.VideoDecoder(info.open_path, **kw)
    rotates = getattr(dec.metadata, "rotation", "absent") != "absent"
    hw = _display_hw(info, scale) if rotates else (scale[1], scale[0])
    if tuple(hw) != (dec.metadata.height, dec.metadata.width):
        dec = mod.VideoDecoder(info.open_path, transforms=[Resize(hw)], **kw)
    return dec, rotates


def decode_torchcodec(info: VideoIndex, indices: List[int], scale: Tuple[int, int],
                      on_frame: OnFrame, device: Optional[str] = None,
                      as_tensor: bool = False) -> None:
    """torchcodec's backend of :func:`vr_runtime.video.decoders.decode_frames`: frames by index
    (torchcodec's exact seek), in order, ``_CHUNK`` a call. ``device``: "cuda" (NVDEC; the
    default where CUDA is) or "cpu". ``as_tensor``: deliver each frame as the decoder's own
    uint8 HxWx3 tensor, on its device (no copy to the host), instead of a numpy array."""
    mod = torchcodec_module()
    if mod is None:
        raise VideoError("decoder 'torchcodec' is not installed here (or does not load: it "
                         "needs a CUDA PyTorch and FFmpeg's shared libraries); use --decoder "
                         "auto or pyav")
    if device is None:
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dec, rotates = _open(mod, info, scale, device)
        if len(dec) != info.num_frames:
            # its frame list disagrees with the demuxer's: its frame i would not be ours
            raise VideoError(f"{info.path}: torchcodec sees {len(dec)} frames, the demuxer "
                             f"{info.num_frames}")
        for s in range(0, len(indices), _CHUNK):
            _check_cancel(info.path)
            batch = dec.get_frames_at(indices=[int(k) for k in indices[s:s + _CHUNK]]).data
            for j in range(batch.shape[0]):
                f = batch[j] if as_tensor else batch[j].cpu().numpy()
                on_frame(s + j, f if rotates or as_tensor else _orient(f, info.rotation))
    except VideoError:
        raise
    except Exception as e:  # torchcodec's RuntimeError/ValueError: one line naming the file
        raise VideoError(f"{info.path}: decoding the {info.codec_name} video with torchcodec "
                         f"on {device} failed ({_clean_reason(e)}); use --decoder pyav") from None
