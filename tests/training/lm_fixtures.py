"""The training tests' fixtures, in a plain module so that the tiny curriculum's tests
(``tests/tiny/conftest.py``) share them: a conftest cannot be imported by name (see
``stage_helpers.py``)."""
import copy

import pytest
import torch


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """Three 12-frame synthetic videos with all three JSONL files."""
    from vr_runtime.data.synthetic_videos import write_dataset
    root = tmp_path_factory.mktemp("syn")
    paths = write_dataset(str(root), 3, seed=7, num_frames=12, split="train")
    return {"root": str(root), **paths}


@pytest.fixture(scope="session")
def _base_lm():
    from vr_runtime.backbones import load_backbone
    return load_backbone("tiny", device="cpu", dtype=torch.float32)


@pytest.fixture
def tiny_lm(_base_lm):
    """A fresh copy of the tiny model for each test (training mutates it)."""
    return copy.deepcopy(_base_lm)
