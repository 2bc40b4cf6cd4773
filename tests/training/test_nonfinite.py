"""Non-finite numbers stop training and loading: a NaN loss ends the run with one line naming
the step and the last finite checkpoint, log.jsonl stays JSON, NaN/inf weights are refused at
load (routers, model, a resumed checkpoint); and one output folder, one training."""
import copy
import json
import os

import pytest
import torch

from stage_helpers import stage_config
from vr_runtime.training import checkpoints as ckpt
from vr_runtime.training.loop import DivergedError, OutputLock, train


def run(cfg, lm, **kw):
    return train(cfg, lm=copy.deepcopy(lm), progress=False, evaluate=False, **kw)


def strict_json(line):
    def refuse(c):
        raise ValueError(f"not JSON: bare {c}")
    return json.loads(line, parse_constant=refuse)


def test_a_nan_loss_stops_training_with_the_step_and_the_last_checkpoint(tiny_data, tiny_lm,
                                                                          tmp_path, monkeypatch):
    from vr_runtime.training import stages
    out = tmp_path / "run"
    forward = stages.Trainee.forward
    calls = [0]

    def poisoned(self, batch):      # the loss turns NaN at the third step, as lr=1e6 makes it
        res = forward(self, batch)
        calls[0] += 1
        if calls[0] >= 3:
            res = dict(res, loss=res["loss"] * float("nan"))
        return res
    monkeypatch.setattr(stages.Trainee, "forward", poisoned)
    with pytest.raises(DivergedError) as e:
        run(stage_config(2, tiny_data, out, max_steps=6, save_steps=1), tiny_lm)
    msg = str(e.value)
    assert "\n" not in msg and "training stopped at step 3: the loss is nan" in msg, msg
    assert f"the last finite checkpoint is {out / 'checkpoint-2'}" in msg and "learning_rate" in msg
    lines = (out / "log.jsonl").read_text().splitlines()
    assert [strict_json(x)["step"] for x in lines] == [1, 2]
    # no result: no routers, no metrics, no checkpoint past the divergence
    assert not (out / "routers.safetensors").exists() and not (out / "metrics.json").exists()
    assert [os.path.basename(p) for p in ckpt.candidates(str(out))] == ["checkpoint-2",
                                                                        "checkpoint-1"]


def test_non_finite_weights_are_never_saved(tiny_data, tiny_lm, tmp_path, monkeypatch):
    from vr_runtime.training import stages
    forward = stages.Trainee.forward

    def poisoned(self, batch):      # a finite loss, but the weights go inf after it
        res = forward(self, batch)
        with torch.no_grad():
            self.routers.semantic.fc2.bias.fill_(float("inf"))
        return res
    monkeypatch.setattr(stages.Trainee, "forward", poisoned)
    out = tmp_path / "run"
    with pytest.raises(DivergedError, match=r"step 1: the weights became non-finite \(.*"
                                            r"semantic.*no checkpoint was saved before it"):
        run(stage_config(2, tiny_data, out, max_steps=2, save_steps=1), tiny_lm)
    assert ckpt.candidates(str(out)) == [] and not (out / "routers.safetensors").exists()


def test_a_resumed_checkpoint_with_nan_weights_is_refused(tiny_data, tiny_lm, tmp_path, capsys):
    from safetensors import safe_open
    from safetensors.torch import save_file
    out = tmp_path / "run"
    run(stage_config(2, tiny_data, out, max_steps=2, save_steps=1), tiny_lm)
    f = out / "checkpoint-2" / "model.safetensors"
    with safe_open(str(f), framework="pt") as h:
        meta, state = h.metadata(), {k: h.get_tensor(k) for k in h.keys()}
    key = next(k for k in state if "semantic" in k and state[k].is_floating_point())
    state[key] = state[key].clone().fill_(float("nan"))
    size = f.stat().st_size
    save_file(state, str(f), metadata=meta)
    assert f.stat().st_size == size      # the checkpoint is complete, only its numbers are bad
    with pytest.raises(ckpt.CheckpointError, match="NaN or inf.*resume from an earlier one"):
        run(stage_config(2, tiny_data, out, max_steps=3, save_steps=1), tiny_lm,
            resume=str(out / "checkpoint-2"))


def test_router_weights_with_nan_are_refused_at_load(tiny_lm, tmp_path):
    from vr_runtime.errors import RouterWeightsError
    from vr_runtime.routing.routers import Routers
    from vr_runtime.runtime import VideoRouter
    r = Routers.from_backbone(tiny_lm)
    with torch.no_grad():
        next(r.parameters()).view(-1)[0] = float("nan")
    path = tmp_path / "routers.safetensors"
    r.save(path)
    with pytest.raises(RouterWeightsError, match="1 tensor\\(s\\) hold NaN or inf"):
        Routers.load(path, tiny_lm)
    with pytest.raises(RouterWeightsError, match="diverged"):
        VideoRouter.from_pretrained("tiny", routers=str(path), device="cpu")


def test_a_model_with_inf_weights_is_refused_at_load(tiny_lm, tmp_path):
    from vr_runtime.backbones import load_backbone
    from vr_runtime.errors import ModelFilesError
    lm = copy.deepcopy(tiny_lm)
    with torch.no_grad():
        lm.embed_tokens.weight[0, 0] = float("inf")
    lm.model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    lm.tokenizer.save_pretrained(tmp_path / "hf")
    with pytest.raises(ModelFilesError, match="hold NaN or inf.*diverged"):
        load_backbone(str(tmp_path / "hf"))


def test_an_output_folder_in_use_by_another_training_is_refused(tiny_data, tiny_lm, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    other = OutputLock(str(out))        # another training holds the folder
    try:
        with pytest.raises(ckpt.CheckpointError, match=rf"in use by another training "
                                                       rf"\(pid {os.getpid()}\)"):
            run(stage_config(2, tiny_data, out, max_steps=1), tiny_lm)
        assert not (out / "log.jsonl").exists()
    finally:
        other.release()
    # the lock goes with its holder: the file left behind does not block the next run
    assert run(stage_config(2, tiny_data, out, max_steps=1), tiny_lm)["global_step"] == 1


def test_no_progress_means_no_bar_at_all(tiny_data, tiny_lm, tmp_path, monkeypatch):
    # Stage 1 fills the feature cache first: its "vision features" bar obeys progress too
    from vr_runtime.training.features import FeatureCache
    seen = []

    class Filled(Exception):
        pass

    def fill(self, videos, progress=True):
        seen.append(progress)
        raise Filled()
    monkeypatch.setattr(FeatureCache, "fill", fill)
    with pytest.raises(Filled):
        run(stage_config(1, tiny_data, tmp_path / "run", max_steps=1), tiny_lm,
            cache_dir=str(tmp_path / "cache"))
    assert seen == [False]
