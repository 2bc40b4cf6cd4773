import copy
import os

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """Three 12-frame synthetic videos with all three JSONL files."""
    from vr_runtime.training.synthetic import generate
    root = tmp_path_factory.mktemp("syn")
    paths = generate(str(root), 3, seed=7, num_frames=12, split="train")
    return {"root": str(root), **paths}


@pytest.fixture(scope="session")
def _base_lm():
    from vr_runtime.model import load_model
    return load_model("tiny", device="cpu", dtype=torch.float32)


@pytest.fixture
def tiny_lm(_base_lm):
    """A fresh copy of the tiny model for each test (training mutates it)."""
    return copy.deepcopy(_base_lm)


def stage_config(stage, data, out, **kw):
    from vr_runtime.training.config import load_config
    names = {1: "relevance", 2: "policy", 3: "conversations"}
    base = dict(train_data=data[names[stage]], eval_data=None, output_dir=str(out), routers=None,
                max_steps=2, per_device_train_batch_size=1, gradient_accumulation_steps=1,
                logging_steps=1, report_to=[], frames_per_example=3, pool_pack_backend="torch",
                router_dim=32, router_heads=4, warmup_ratio=0.0, lr_scheduler_type="constant")
    base.update(kw)
    return load_config(f"tiny_stage{stage}", **base)
