"""Checkpoint retention (save_total_limit, checkpoints.prune): the newest complete checkpoints
stay, the one resumed from is never deleted, and a kill or a failed deletion in the middle of
the pruning leaves every kept checkpoint complete."""
import copy
import os

import pytest

from stage_helpers import stage_config
from vr_runtime.training import checkpoints as ckpt


def _save(out, step, size=64):
    """A checkpoint as the loop commits it: files in a .tmp folder, then the rename."""
    tmp = ckpt.begin(str(out), step)
    os.makedirs(os.path.join(tmp, "sub"))
    for name in ("model.safetensors", "optimizer.bin", os.path.join("sub", "rng.pkl")):
        with open(os.path.join(tmp, name), "wb") as f:
            f.write(bytes(size))
    return ckpt.commit(tmp, {"global_step": step, "epoch": 0, "micro_step_in_epoch": step,
                             "history": []})


def _steps(out):
    good, torn = ckpt.latest(str(out))
    return [s["global_step"] for _, s in good], [name for name, _ in torn]


def test_keeps_the_newest_complete_and_the_resumed_one(tmp_path):
    out = tmp_path / "run"
    for step in range(1, 6):
        _save(out, step)
    assert ckpt.prune(str(out), 0) == [] and _steps(out)[0] == [5, 4, 3, 2, 1]   # 0: keep all
    removed = ckpt.prune(str(out), 2, protect=(str(out / "checkpoint-1"), None))
    assert removed == ["checkpoint-2", "checkpoint-3"]            # oldest first
    assert _steps(out) == ([5, 4, 1], [])
    assert sorted(os.listdir(out)) == ["checkpoint-1", "checkpoint-4", "checkpoint-5"]


def test_torn_ones_older_than_the_newest_complete_go_newer_stay(tmp_path):
    out = tmp_path / "run"
    for step in (1, 2, 3, 4):
        _save(out, step)
    os.remove(out / "checkpoint-1" / "optimizer.bin")            # torn, old
    with open(out / "checkpoint-4" / "model.safetensors", "r+b") as f:
        f.truncate(10)                                            # torn, newest
    assert _steps(out) == ([3, 2], ["checkpoint-4", "checkpoint-1"])
    assert ckpt.prune(str(out), 1) == ["checkpoint-1", "checkpoint-2"]
    assert _steps(out) == ([3], ["checkpoint-4"])


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs (not even except Exception)."""


@pytest.mark.parametrize("when", ["mid-delete", "after-rename"])
def test_a_kill_during_pruning_leaves_complete_checkpoints(when, tmp_path, monkeypatch):
    out = tmp_path / "run"
    for step in range(1, 5):
        _save(out, step)
    real_rmtree = ckpt.shutil.rmtree
    real_rename = ckpt.os.rename

    def rmtree(path, *a, **k):
        if when == "mid-delete":          # half the files gone, then the kill
            os.remove(os.path.join(path, "model.safetensors"))
        raise Killed()

    def rename(src, dst):
        real_rename(src, dst)
        if when == "after-rename":
            raise Killed()
    monkeypatch.setattr(ckpt.shutil, "rmtree", rmtree)
    monkeypatch.setattr(ckpt.os, "rename", rename)
    with pytest.raises(Killed):
        ckpt.prune(str(out), 2)
    monkeypatch.setattr(ckpt.shutil, "rmtree", real_rmtree)
    monkeypatch.setattr(ckpt.os, "rename", real_rename)
    # what `--resume latest` sees after the kill: only complete checkpoints, the newest first
    good, torn = _steps(out)
    assert good[:2] == [4, 3] and torn == []
    assert os.path.isdir(out / "checkpoint-1.del")
    assert ckpt.tidy(str(out)) == ["checkpoint-1.del"]           # the next start clears it
    assert ckpt.prune(str(out), 2) == ["checkpoint-2"]
    assert _steps(out) == ([4, 3], [])


def test_a_failed_deletion_is_one_line_and_keeps_going(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    for step in range(1, 5):
        _save(out, step)
    real_rmtree = ckpt.shutil.rmtree

    def rmtree(path, *a, **k):
        if path.endswith("checkpoint-1.del"):
            raise PermissionError(13, "Permission denied", path)
        return real_rmtree(path, *a, **k)
    monkeypatch.setattr(ckpt.shutil, "rmtree", rmtree)
    assert ckpt.prune(str(out), 2) == ["checkpoint-2"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "checkpoint-1" in err[0] and "Permission denied" in err[0]
    assert _steps(out) == ([4, 3], [])


def test_config_default_and_bad_value():
    from vr_runtime.training.config import ConfigError, TrainConfig
    assert TrainConfig().save_total_limit == 2
    with pytest.raises(ConfigError, match="save_total_limit: expected >= 0"):
        TrainConfig(save_total_limit=-1).validate()


def test_training_keeps_two_and_never_the_resumed_one(tiny_data, tiny_lm, tmp_path):
    from vr_runtime.training.loop import train
    out = tmp_path / "run"
    train(stage_config(2, tiny_data, out, max_steps=3, save_steps=1), lm=copy.deepcopy(tiny_lm),
          progress=False, evaluate=False)
    assert _steps(out) == ([3, 2], [])                           # the default limit, 2
    # resumed from checkpoint-2 with a limit of 1: the new ones come and go, 2 stays
    train(stage_config(2, tiny_data, out, max_steps=5, save_steps=1, save_total_limit=1),
          lm=copy.deepcopy(tiny_lm), progress=False, evaluate=False,
          resume=str(out / "checkpoint-2"))
    assert _steps(out) == ([5, 2], [])
