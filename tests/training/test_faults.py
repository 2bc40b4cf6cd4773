"""Fault injection for training (issue 28): kill -9 at random points, torn checkpoint files, a
kill during the final save, resume bookkeeping (log.jsonl, elapsed_s), bad configs."""
import copy
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

from stage_helpers import stage_config
# Imported before the tests below patch vr_runtime.backbones.load_backbone: a module imported
# for the first time under the patch (runtime, through the CLI's labels import) would keep the
# patched function after the test.
import vr_runtime.runtime  # noqa: F401,E402
from vr_runtime.training import checkpoints as ckpt
from vr_runtime.training.__main__ import main as training_main
from vr_runtime.training.loop import train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the config file itself: the paper's command knows the tiny configs' names only once vr_tiny
# is imported, which a fresh interpreter has not done
TINY_STAGE2 = os.path.join(ROOT, "vr_tiny", "configs", "tiny_stage2.json")


def run(cfg, lm, **kw):
    return train(cfg, lm=copy.deepcopy(lm), progress=False, evaluate=False, **kw)


def routers_of(res):
    return {k: v.detach().clone() for k, v in res["trainee"].routers.state_dict().items()}


def assert_same(a, b):
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6, msg=k)


def log_steps(out):
    with open(os.path.join(out, "log.jsonl")) as f:
        return [json.loads(line)["step"] for line in f]


def truncate(path, keep=0.5):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(int(size * keep))


# ---------------------------------------------------------------- torn checkpoints

def test_resume_latest_skips_a_torn_trainer_state(tiny_data, tiny_lm, tmp_path, capsys):
    """The issue's kill between the two writes of the newest trainer_state.json: the previous
    checkpoint is intact, so --resume latest takes it and says which one it skipped."""
    out = tmp_path / "run"
    ref = routers_of(run(stage_config(2, tiny_data, out, max_steps=3, save_steps=1), tiny_lm))
    state = out / "checkpoint-3" / "trainer_state.json"
    truncate(state)
    capsys.readouterr()
    res = run(stage_config(2, tiny_data, out, max_steps=3, save_steps=1), tiny_lm,
              resume="latest")
    err = capsys.readouterr().err
    skipped = [line for line in err.splitlines() if "skipped torn" in line]
    assert len(skipped) == 1 and "checkpoint-3" in skipped[0], err
    assert res["global_step"] == 3
    assert_same(ref, routers_of(res))
    assert ckpt.read_state(str(out / "checkpoint-3"))["global_step"] == 3   # rewritten whole
    assert log_steps(out) == [1, 2, 3]


def test_resume_latest_skips_a_truncated_weights_file(tiny_data, tiny_lm, tmp_path, capsys):
    out = tmp_path / "run"
    ref = routers_of(run(stage_config(2, tiny_data, out, max_steps=3, save_steps=1), tiny_lm))
    truncate(out / "checkpoint-3" / "model.safetensors")
    capsys.readouterr()
    res = run(stage_config(2, tiny_data, out, max_steps=3, save_steps=1), tiny_lm,
              resume="latest")
    assert "skipped torn checkpoint(s): checkpoint-3" in capsys.readouterr().err
    assert_same(ref, routers_of(res))


@pytest.mark.parametrize("damage", ["trainer_state.json", "model.safetensors", "optimizer.bin",
                                    "missing"])
def test_a_torn_named_checkpoint_is_one_line(damage, tiny_data, tiny_lm, tmp_path, capsys,
                                            monkeypatch):
    """--resume <folder> with a torn file: one line and exit 2, before the model loads."""
    out = tmp_path / "run"
    run(stage_config(2, tiny_data, out, max_steps=1, save_steps=1), tiny_lm)
    folder = out / "checkpoint-1"
    if damage == "missing":
        folder = out / "checkpoint-7"
    else:
        truncate(folder / damage)

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the checkpoint was checked")
    monkeypatch.setattr("vr_runtime.backbones.load_backbone", no_model)
    capsys.readouterr()
    rc = training_main(["stage", "--config", "tiny_stage2", "--resume", str(folder),
                        "--no-progress", "--set", *overrides(tiny_data, out, 2)])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err
    assert str(folder) in err


def test_a_torn_file_the_manifest_cannot_see_is_one_line(tiny_data, tiny_lm, tmp_path):
    """A checkpoint without the file sizes (written before them) whose optimizer file is torn:
    loading it fails, and that is one CheckpointError line, not a traceback."""
    out = tmp_path / "run"
    run(stage_config(2, tiny_data, out, max_steps=1, save_steps=1), tiny_lm)
    state_path = out / "checkpoint-1" / "trainer_state.json"
    st = json.loads(state_path.read_text())
    st.pop("files", None)
    state_path.write_text(json.dumps(st))
    truncate(out / "checkpoint-1" / "optimizer.bin")
    with pytest.raises(ckpt.CheckpointError, match="cannot be loaded") as e:
        run(stage_config(2, tiny_data, out, max_steps=2, save_steps=1), tiny_lm,
            resume=str(out / "checkpoint-1"))
    assert "\n" not in str(e.value)


class Killed(BaseException):
    """Stands for SIGKILL inside the process: nothing after it runs (not even except Exception)."""


@pytest.mark.parametrize("kill_at", [1, 2, 3])
def test_a_kill_inside_any_save_leaves_complete_checkpoints(kill_at, tiny_data, tiny_lm,
                                                             tmp_path, monkeypatch):
    """Kill the k-th save after it wrote half a file. With save_steps dividing max_steps, the
    3rd save was the final one, which rewrote checkpoint-4 in place (issue 28: 'PytorchStream
    Reader failed reading zip archive' on resume). Every complete checkpoint must stay
    complete, and --resume latest must finish the run with the uninterrupted weights."""
    from accelerate import Accelerator
    ref = routers_of(run(stage_config(2, tiny_data, tmp_path / "ref", max_steps=4, save_steps=2),
                         tiny_lm))
    out = tmp_path / "run"
    real = Accelerator.save_state
    calls = []

    def dying_save(self, output_dir=None, **kw):
        calls.append(output_dir)
        r = real(self, output_dir, **kw)
        if len(calls) == kill_at:
            truncate(os.path.join(output_dir, "model.safetensors"))
            raise Killed
        return r
    monkeypatch.setattr(Accelerator, "save_state", dying_save)
    try:
        run(stage_config(2, tiny_data, out, max_steps=4, save_steps=2), tiny_lm)
    except Killed:
        pass
    monkeypatch.setattr(Accelerator, "save_state", real)
    for folder in ckpt.candidates(str(out)):
        ckpt.read_state(folder)                      # every checkpoint-N is complete
        torch.load(os.path.join(folder, "optimizer.bin"), weights_only=False)
    res = run(stage_config(2, tiny_data, out, max_steps=4, save_steps=2), tiny_lm,
              resume="latest")
    assert res["global_step"] == 4
    assert_same(ref, routers_of(res))
    assert not [n for n in os.listdir(out) if n.endswith((ckpt.TMP, ckpt.OLD))]
    assert log_steps(out) == [1, 2, 3, 4]


def test_a_kill_between_the_renames_of_a_replacement_keeps_the_checkpoint(tmp_path):
    """Replacing checkpoint-N: a kill after it stepped aside (.old) and before the new one took
    its name. The next start puts the complete one back."""
    out = tmp_path
    tmp = ckpt.begin(str(out), 5)
    os.makedirs(tmp)
    (out / "checkpoint-5.tmp" / "w.bin").write_bytes(b"x" * 10)
    ckpt.commit(tmp, {"global_step": 5, "epoch": 0, "micro_step_in_epoch": 5, "history": []})
    os.rename(out / "checkpoint-5", out / ("checkpoint-5" + ckpt.OLD))
    os.makedirs(out / "checkpoint-5.tmp")              # the new one, half written
    ckpt.tidy(str(out))
    assert sorted(os.listdir(out)) == ["checkpoint-5"]
    assert ckpt.read_state(str(out / "checkpoint-5"))["global_step"] == 5


# ---------------------------------------------------------------- resume bookkeeping

def test_resume_continues_log_and_elapsed_time(tiny_data, tiny_lm, tmp_path, monkeypatch):
    """After a resume log.jsonl has each step once, and elapsed_s goes on from the checkpoint's
    (a fake clock: each reading is 100 s after the previous one)."""
    import vr_runtime.training.loop as loop

    class Clock:
        now = 0.0

        def time(self):
            Clock.now += 100.0
            return Clock.now
    monkeypatch.setattr(loop, "time", Clock())
    out = tmp_path / "run"
    run(stage_config(2, tiny_data, out, max_steps=4, save_steps=2), tiny_lm)
    assert log_steps(out) == [1, 2, 3, 4]
    at_ckpt = ckpt.read_state(str(out / "checkpoint-2"))["elapsed_s"]
    res = run(stage_config(2, tiny_data, out, max_steps=4, save_steps=2), tiny_lm,
              resume=str(out / "checkpoint-2"))
    assert log_steps(out) == [1, 2, 3, 4]
    assert [h["step"] for h in res["history"]] == [1, 2, 3, 4]
    with open(out / "log.jsonl") as f:
        elapsed = [json.loads(line)["elapsed_s"] for line in f]
    assert elapsed == sorted(elapsed) and elapsed[2] > at_ckpt >= elapsed[1], elapsed


def test_resume_at_the_last_step_saves_nothing_and_ends(tiny_data, tiny_lm, tmp_path):
    """Resuming a finished run (step == max_steps) ended with UnboundLocalError."""
    out = tmp_path / "run"
    run(stage_config(2, tiny_data, out, max_steps=2, save_steps=2), tiny_lm)
    before = os.path.getmtime(out / "checkpoint-2" / "trainer_state.json")
    res = run(stage_config(2, tiny_data, out, max_steps=2, save_steps=2), tiny_lm,
              resume="latest")
    assert res["global_step"] == 2
    assert os.path.getmtime(out / "checkpoint-2" / "trainer_state.json") == before


# ---------------------------------------------------------------- kill -9 of a real run

def overrides(data, out, stage, **kw):
    names = {1: "relevance", 2: "policy", 3: "conversations"}
    d = dict(train_data=data[names[stage]], eval_data=None, output_dir=str(out), routers=None,
             per_device_train_batch_size=1, gradient_accumulation_steps=1, logging_steps=1,
             report_to=[], router_dim=32, router_heads=4, warmup_ratio=0.0,
             lr_scheduler_type="constant", frames_per_example=3, pool_pack_backend="torch")
    d.update(kw)
    return [f"{k}={json.dumps(v)}" for k, v in d.items()]


def test_sigkill_at_a_random_point_then_resume_latest(tiny_data, tiny_lm, tmp_path):
    """A real training process killed with SIGKILL once its log reaches a random step (plus a
    random few milliseconds, so the kill lands anywhere: mid-step, mid-save, mid-rename), then
    --resume latest: the run ends with each step logged once and the weights of an
    uninterrupted run. VR_FAULT_SEED replays a failure."""
    seed = int(os.environ.get("VR_FAULT_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    # a step takes ~10 ms here: the kill lands well before the run's own end
    steps, out = 30, tmp_path / "run"
    kill_at, delay = rng.randint(1, steps - 10), rng.uniform(0, 0.05)
    sets = overrides(tiny_data, out, 2, max_steps=steps, save_steps=rng.choice([1, 2, 3]))
    cmd = [sys.executable, "-m", "vr_runtime.training", "stage", "--config", TINY_STAGE2,
           "--no-progress", "--resume", "latest", "--set", *sets]
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    log = out / "log.jsonl"
    deadline = time.time() + 120
    while proc.poll() is None and time.time() < deadline:
        if log.exists() and len(log.read_bytes().splitlines()) >= kill_at:
            time.sleep(delay)
            break
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    err = proc.communicate()[1].decode()
    assert proc.returncode == -signal.SIGKILL, f"seed {seed}: {err[-2000:]}"

    from vr_runtime.training.config import load_config
    cfg = load_config("tiny_stage2", **{k: json.loads(v) for k, v in
                                        (s.split("=", 1) for s in sets)})
    res = run(cfg, tiny_lm, resume="latest")
    assert res["global_step"] == steps, f"seed {seed}"
    assert log_steps(out) == list(range(1, steps + 1)), f"seed {seed}"
    ref = routers_of(run(load_config("tiny_stage2", **dict(
        cfg.to_dict(), output_dir=str(tmp_path / "ref"))), tiny_lm))
    assert_same(ref, routers_of(res))


# ---------------------------------------------------------------- bad configs

BAD_SETS = [
    (["learning_rate=abc"], "learning_rate"),
    (["logging_steps=0"], "logging_steps"),
    (["num_train_epochs=-1"], "num_train_epochs"),
    (["max_steps=-5"], "max_steps"),
    (["save_steps=1.5"], "save_steps"),
    (["per_device_train_batch_size=true"], "per_device_train_batch_size"),
    (["report_to=tensorboard"], "report_to"),
    (["router_dim=30", "router_heads=4"], "router_dim"),
    (["fragment_windows=[1, 0]"], "fragment_windows"),
    (["pool_pack_backend=cuda"], "pool_pack_backend"),
    (["learnin_rate=0.1"], "learning_rate"),          # unknown key, with the near one
    (["eval_data=/no/such/heldout.jsonl"], "eval_data"),
    (["train_data=/no/such/train.jsonl"], "train_data"),
    (["train_data=null"], "train_data"),
    (["routers=/no/such/routers.safetensors"], "routers"),
    (["model=/no/such/model"], "model"),
    (["learning_rate"], "key=value"),
]


@pytest.mark.parametrize("bad,key", BAD_SETS, ids=[b[0][0] for b in BAD_SETS])
def test_bad_set_values_are_one_line_before_the_model(bad, key, tiny_data, tmp_path, capsys,
                                                      monkeypatch):
    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the config was checked")
    monkeypatch.setattr("vr_runtime.backbones.load_backbone", no_model)
    rc = training_main(["stage", "--config", "tiny_stage2", "--no-progress", "--set",
                        *overrides(tiny_data, tmp_path / "run", 2, max_steps=2), *bad])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and key in err, err
    assert not os.path.exists(tmp_path / "run" / "log.jsonl")


@pytest.mark.parametrize("text,what", [("[1, 2]", "JSON object"),
                                       ('{"stage": 2,', "not valid JSON"),
                                       ('{"stage": 2, "bogus": 1}', "bogus"),
                                       ('{"stage": "2"}', "stage")])
def test_bad_config_files_are_one_line(text, what, tmp_path, capsys):
    path = tmp_path / "cfg.json"
    path.write_text(text)
    rc = training_main(["stage", "--config", str(path), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and what in err, err


def test_train_checks_a_config_built_in_code(tiny_data, tmp_path, monkeypatch):
    """train() itself checks the config whole (a caller that built or mutated it skipped
    load_config): logging_steps=0 was a ZeroDivisionError after the model loaded."""
    from vr_runtime.training.config import ConfigError

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the config was checked")
    monkeypatch.setattr("vr_runtime.backbones.load_backbone", no_model)
    cfg = stage_config(2, tiny_data, tmp_path / "run")
    cfg.logging_steps = 0
    with pytest.raises(ConfigError, match="logging_steps"):
        train(cfg, progress=False, evaluate=False)


def test_a_bad_heldout_line_stops_the_run_before_the_model(tiny_data, tmp_path, capsys,
                                                           monkeypatch):
    """The held-out file was read only after training ended: a bad line there cost the run."""
    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the data was checked")
    monkeypatch.setattr("vr_runtime.backbones.load_backbone", no_model)
    bad = tmp_path / "heldout.jsonl"
    bad.write_text(open(tiny_data["policy"]).readline() + '{"video": 3}\n')
    rc = training_main(["stage", "--config", "tiny_stage2", "--no-progress", "--set",
                        *overrides(tiny_data, tmp_path / "run", 2, max_steps=2),
                        f"eval_data={json.dumps(str(bad))}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "heldout.jsonl" in err, err
