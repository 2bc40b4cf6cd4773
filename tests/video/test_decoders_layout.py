"""vr_runtime.video.decoders after the split into one module a decoder: every name it exported
still imports from it, as the very object its new home defines."""
import importlib

from vr_runtime.video import (decoders, decord_decoder, probe, pyav_decoder,
                              torchcodec_decoder, workers)


def test_every_exported_name_still_imports_from_decoders():
    homes = (probe, pyav_decoder, decord_decoder, torchcodec_decoder, workers)
    for name in decoders.__all__:
        obj = getattr(decoders, name)
        owner = [m for m in homes if getattr(m, name, None) is obj]
        # defined in one of the decoder modules, or (registry and dispatch) in decoders itself
        assert owner or getattr(obj, "__module__", decoders.__name__) == decoders.__name__, name
    from vr_runtime.video.decoders import (  # noqa: F401  (the import itself is the test)
        DECODERS, SEEKS, Limits, VideoIndex, available_decoders, cancel_scope, decode_frames,
        default_workers, keyframe_indices, limits, probe as probe_fn, resolve_decoder,
        resolve_seek, resolve_workers, scaled_size, set_limits, split_by_gop)
    assert probe_fn is probe.probe and Limits is probe.Limits
    assert decoders.DECORD_CODECS is decord_decoder.DECORD_CODECS


def test_set_limits_is_seen_by_the_probe():
    old = decoders.set_limits(max_frames=7)
    try:
        assert probe.limits().max_frames == 7 and decoders.limits() is probe.limits()
    finally:
        decoders.set_limits(**vars(old))


def test_the_backends_are_the_decoder_modules():
    assert decoders._BACKENDS == {"pyav": pyav_decoder.decode_pyav,
                                  "decord": decord_decoder.decode_decord,
                                  "torchcodec": torchcodec_decoder.decode_torchcodec}
    assert importlib.import_module("vr_runtime.video.decoders") is decoders
