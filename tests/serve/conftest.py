"""Fixtures shared by the serve tests: the tiny runtime (loaded once per module) and a media
directory holding the sample clip (test_serve_app.py has a richer one of its own)."""
import os

import pytest

from serve_helpers import SAMPLE


@pytest.fixture(scope="module")
def vr():
    from vr_runtime.runtime import VideoRouter
    return VideoRouter.from_pretrained("tiny", device="cpu", visual_cache_size=4)


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    m = tmp_path_factory.mktemp("media")
    m = type(m)(os.path.realpath(m))
    (m / "sample.mp4").write_bytes(SAMPLE.read_bytes())
    return m
