"""Shared fixtures of the evaluation tests: a small synthetic benchmark in Video-MME layout
(three videos: 16, 32 and 64 frames; six questions) and a tiny random CLIP directory."""
import os

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def synth_bench(tmp_path_factory):
    from vr_runtime.eval.synthetic import make_synthetic
    root = tmp_path_factory.mktemp("videomme_syn")
    return make_synthetic(root, videos_per_split=1, seed=3)


@pytest.fixture(scope="session")
def clip_dir(tmp_path_factory):
    from vr_runtime.eval.synthetic import make_random_clip
    return make_random_clip(tmp_path_factory.mktemp("clip"))
