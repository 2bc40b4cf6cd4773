"""scripts/tiny/train_tiny.sh --task: v9 (task v8's with colour-first answers, the shipped
weights') is the default, v5 task v3's stages plus Stages 3e and 3f, v4 v3's stages plus Stage
3d, v3 v2's plus Stage 3c, v2 the wider task without Stage 3c, each in its own work folder,
and with --install measures routing per factor into its own results file; --task v1 keeps the original task's sizes and folder;
--from-v2 DIR starts Stage 3c from a finished v2 model, --from-v3 DIR Stage 3e (or with --task
v4, Stage 3d) from a finished v3 model, --from-v5 DIR task v6's Stage 3g from a finished v5
model.
A fake ``python`` on PATH records the calls (nothing is trained: conftest.run_train_tiny)."""
from tiny_helpers import flat


def arg(call, name):
    return call[call.index(name) + 1]


def test_task_v1_keeps_its_sizes_and_folder(tmp_path, run_train_tiny):
    p, calls = run_train_tiny(tmp_path, "--task", "v1")
    assert p.returncode == 0, p.stderr
    assert "--task" not in calls[0]    # the tiny command's own default task is v1
    assert (arg(calls[0], "--train"), arg(calls[0], "--heldout")) == ("480", "60")
    assert arg(calls[0], "--work") == "runs/tiny"


def test_task_v2_trains_in_its_own_folder_and_installs_per_factor_results(tmp_path,
                                                                          run_train_tiny):
    for i, (form, task) in enumerate((([], "v9"), (["--task", "v2"], "v2"),
                                      (["--task=v2"], "v2"), (["--task", "v3"], "v3"),
                                      (["--task=v4"], "v4"), (["--task=v5"], "v5"),
                                      (["--task", "v6"], "v6"), (["--task=v8"], "v8"),
                                      (["--task", "v9"], "v9"))):
        p, calls = run_train_tiny(tmp_path / f"form{i}", *form)
        assert p.returncode == 0, p.stderr
        assert arg(calls[0], "--task") == task and arg(calls[0], "--work") == f"runs/tiny_{task}"
        assert (arg(calls[0], "--train"), arg(calls[0], "--heldout")) == ("960", "85")
        assert "--ship" not in calls[0] and "--from-model" not in calls[0] and len(calls) == 1
    p, calls = run_train_tiny(tmp_path / "install", "--install", "--task", "v2", "w")
    assert p.returncode == 0, p.stderr
    assert "--ship" in calls[0] and arg(calls[0], "--work") == "w"
    assert arg(calls[0], "--results") == "studies/results/shipped_v2"
    assert arg(calls[1], "--out") == "studies/results/shipped_v2/routing_wide_heldout.json"
    assert arg(calls[1], "--data") == "w/data/heldout_conversations.jsonl"
    # the combined "footage" setting
    assert calls[2][:3] == ["-m", "vr_tiny", "synth"] and arg(calls[2], "--task") == "v2"
    assert arg(calls[2], "--footage") == "20" and arg(calls[2], "--out") == "w/data"
    assert arg(calls[3], "--data") == "w/data/footage_conversations.jsonl"
    assert arg(calls[3], "--out") == "studies/results/shipped_v2/routing_wide_footage.json"
    # and the basic task's held-out split, measured with the installed weights
    assert calls[4][:4] == ["-m", "vr_tiny", "synth", "--out"]
    assert arg(calls[4], "--out") == "w/data_v1" and arg(calls[4], "--heldout") == "60"
    assert arg(calls[5], "--data") == "w/data_v1/heldout_conversations.jsonl"
    assert arg(calls[5], "--out") == "studies/results/shipped_v2/routing_basic_heldout.json" and len(calls) == 6


def test_bad_task_is_one_line_and_exit_2(tmp_path, run_train_tiny):
    for i, args in enumerate((["--task", "v7"], ["--task"], ["--task=x"], ["--task=v0"],
                              ["--task=v7"], ["--task", "v10"])):
        p, calls = run_train_tiny(tmp_path / str(i), *args)
        assert p.returncode == 2 and calls == []
        assert len(p.stderr.strip().splitlines()) == 1 and "--task" in p.stderr


def test_from_v2_starts_stage3c_from_a_finished_model(tmp_path, run_train_tiny):
    p, calls = run_train_tiny(tmp_path / "ok", "--from-v2", "v2w", "w")
    assert p.returncode == 0, p.stderr
    assert arg(calls[0], "--task") == "v3" and arg(calls[0], "--from-model") == "v2w"
    assert "stage3c" in p.stderr
    for i, args in enumerate((["--task", "v2", "--from-v2", "d"], ["--from-v2"],
                              ["--task", "v4", "--from-v2", "d"])):
        p, calls = run_train_tiny(tmp_path / str(i), *args)
        assert p.returncode == 2 and calls == []
        assert len(p.stderr.strip().splitlines()) == 1 and "--from-v2" in p.stderr


def test_from_v3_starts_stage3e_or_3d_from_a_finished_model(tmp_path, run_train_tiny):
    for i, form in enumerate((["--from-v3", "v3w"], ["--from-v3=v3w"])):
        p, calls = run_train_tiny(tmp_path / f"ok{i}", *form, "w")
        assert p.returncode == 0, p.stderr
        assert arg(calls[0], "--task") == "v5" and arg(calls[0], "--from-model") == "v3w"
        assert "stage3f" in p.stderr
    p, calls = run_train_tiny(tmp_path / "v4", "--task", "v4", "--from-v3", "v3w", "w")
    assert p.returncode == 0, p.stderr
    assert arg(calls[0], "--task") == "v4" and "stage3d" in p.stderr
    for i, args in enumerate((["--task", "v3", "--from-v3", "d"], ["--from-v3"],
                              ["--task", "v8", "--from-v3", "d"])):
        p, calls = run_train_tiny(tmp_path / str(i), *args)
        assert p.returncode == 2 and calls == []
        assert len(p.stderr.strip().splitlines()) == 1 and "--from-v3" in p.stderr


def test_from_v5_starts_stage3g_from_a_finished_model(tmp_path, run_train_tiny):
    for i, form in enumerate((["--from-v5", "v5w"], ["--from-v5=v5w"], ["--task", "v6",
                                                                         "--from-v5", "v5w"])):
        p, calls = run_train_tiny(tmp_path / f"ok{i}", *form, "w")
        assert p.returncode == 0, p.stderr
        assert arg(calls[0], "--task") == "v6" and arg(calls[0], "--from-model") == "v5w"
        assert "stage3g" in p.stderr
    for i, args in enumerate((["--task", "v5", "--from-v5", "d"], ["--from-v5"],
                              ["--task", "v6", "--from-v3", "d"])):
        p, calls = run_train_tiny(tmp_path / str(i), *args)
        assert p.returncode == 2 and calls == []
        assert len(p.stderr.strip().splitlines()) == 1 and "--from-v" in p.stderr


def test_tiny_demo_writes_missing_videos_and_keeps_the_others(tmp_path):
    from vr_runtime.training.config import load_config
    from vr_tiny.recipe import V2_TRAIN_BUDGET_FRACTION, prepare_data
    data = tmp_path / "data"
    prepare_data(str(data), 1, 2, seed=3, task="v2")
    videos = sorted(data.glob("*/*.mp4"))
    lines = (data / "heldout_conversations.jsonl").read_text()
    assert len(videos) == 3 and all("_v2_" in v.name for v in videos)
    kept = {v: v.stat().st_mtime_ns for v in videos}
    videos[0].unlink()   # deleted, or never finished
    prepare_data(str(data), 1, 2, seed=3, task="v2")
    assert sorted(data.glob("*/*.mp4")) == videos
    assert all(v.stat().st_mtime_ns == t for v, t in kept.items() if v != videos[0])
    assert (data / "heldout_conversations.jsonl").read_text() == lines
    # a v1 run beside it writes its own videos and lines, never over the v2 ones
    prepare_data(str(data), 1, 1, seed=3, task="v1")
    assert len(sorted(data.glob("*/*.mp4"))) == 5
    # Stage 3b's v2 budgets are a valid config
    cfg = load_config("tiny_stage3b", train_max_length=[],
                      train_budget_fraction=V2_TRAIN_BUDGET_FRACTION)
    assert cfg.train_budget_fraction == [0.18, 0.48]


def test_cli_refuses_a_tiny_run_without_videos(capsys):
    from vr_tiny.__main__ import main
    assert main(["tiny", "--task", "v2", "--train", "0", "--work", "/nonexistent/w"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--train" in err[0]


def test_stage3c_reads_the_first_videos_lines(tmp_path):
    import json
    from vr_tiny.recipe import first_videos
    src = tmp_path / "all.jsonl"
    rows = [{"video": f"v{i // 3}.mp4", "q": i} for i in range(12)]     # 4 videos, 3 lines each
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = first_videos(str(src), 2, str(tmp_path / "sub.jsonl"))
    got = [json.loads(line) for line in open(out)]
    assert got == rows[:6]


def test_cli_checks_from_model_before_anything_runs(tmp_path, capsys):
    from vr_tiny.__main__ import main
    assert main(["tiny", "--task", "v2", "--from-model", str(tmp_path),
                 "--work", str(tmp_path / "w")]) == 2
    assert main(["tiny", "--task", "v3", "--from-model", str(tmp_path),
                 "--work", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "add --task v3" in err[0] and "model.safetensors" in err[1]
    assert not (tmp_path / "w").exists()


def test_task_v4_continues_stage3c(tmp_path):
    """Task v4's Stage 3d: from Stage 3c's model (or a finished v3 model when started from
    one), on Stage 3c's first videos, with route supervision on."""
    from vr_tiny.recipe import FROM_TASK, LATER_STAGES, _stage_config
    data, work = tmp_path / "data", str(tmp_path / "w")
    data.mkdir()
    (data / "train_conversations.jsonl").write_text('{"video": "a.mp4"}\n')
    own = LATER_STAGES["v4"][len(LATER_STAGES[FROM_TASK["v4"]]):]
    assert own == ("3d",)
    d = _stage_config("3d", str(data), work, "base", "r3c", "v4")
    assert d.model == f"{work}/stage3c/hf" and d.routers == "r3c"
    assert d.output_dir == f"{work}/stage3d"
    assert d.train_data.endswith("train_conversations_3c.jsonl")
    assert d.extensions["tiny"].route_weight > 0 and d.extensions["tiny"].dense_plan_dialogue
    assert _stage_config("3d", str(data), work, "base", "r", "v4", start="v3w").model == "v3w"
    c = _stage_config("3c", str(data), work, "base", "r", "v3", start="v2w")
    assert c.model == "v2w" and c.extensions["tiny"].route_weight == 0


def test_task_v5_continues_stage3c_on_every_video(tmp_path):
    """Task v5's Stages 3e and 3f: Stage 3d's settings on every training video (not Stage 3c's
    first 320), 3e from Stage 3c's model (or a finished v3 model), 3f from 3e's with its own
    seed."""
    from vr_runtime.training.config import load_config
    from vr_tiny.recipe import FROM_TASK, LATER_STAGES, _stage_config
    data, work = tmp_path / "data", str(tmp_path / "w")
    data.mkdir()
    (data / "train_conversations.jsonl").write_text('{"video": "a.mp4"}\n')
    assert LATER_STAGES["v5"][len(LATER_STAGES[FROM_TASK["v5"]]):] == ("3e", "3f")
    e = _stage_config("3e", str(data), work, "base", "r3c", "v5")
    assert e.model == f"{work}/stage3c/hf" and e.routers == "r3c"
    assert e.train_data == str(data / "train_conversations.jsonl")
    assert _stage_config("3e", str(data), work, "base", "r", "v5", start="v3w").model == "v3w"
    f = _stage_config("3f", str(data), work, "base", "r3e", "v5")
    assert f.model == f"{work}/stage3e/hf" and f.output_dir == f"{work}/stage3f"
    assert f.train_data == e.train_data and f.seed != e.seed
    d = load_config("tiny_stage3d").to_dict()
    for cfg in (e, f):   # Stage 3d's settings but for the paths and the seed
        got = cfg.to_dict()
        assert {k for k in d if d[k] != got[k]} <= {"model", "routers", "train_data",
                                                   "eval_data", "output_dir", "seed"}


def test_task_v6_continues_stage3f_on_more_videos(tmp_path):
    """Task v6's Stage 3g: Stage 3f's settings, from 3f's model (or a finished v5 model), on
    the training videos and those of WORK/data_more in one file whose paths still resolve."""
    import json
    from vr_runtime.training.config import load_config
    from vr_runtime.training.data import read_jsonl
    from vr_tiny.recipe import FROM_TASK, LATER_STAGES, _stage_config
    work = tmp_path / "w"
    data, more = work / "data", work / "data_more"
    for folder, n in ((data, 2), (more, 3)):
        (folder / "train").mkdir(parents=True)
        rows = [{"id": f"train_v2_{i:05d}_0", "video": f"train/train_v2_{i:05d}.mp4",
                 "conversations": [{"from": "human", "value": "<video>\nWhat shape is red?"},
                                   {"from": "gpt", "value": "circle"}]} for i in range(n)]
        (folder / "train_conversations.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows))
        for r in rows:
            (folder / r["video"]).write_bytes(b"")
    assert LATER_STAGES["v6"][len(LATER_STAGES[FROM_TASK["v6"]]):] == ("3g",)
    g = _stage_config("3g", str(data), str(work), "base", "r3f", "v6")
    assert g.model == f"{work}/stage3f/hf" and g.routers == "r3f"
    assert g.output_dir == f"{work}/stage3g"
    assert _stage_config("3g", str(data), str(work), "b", "r", "v6", start="v5w").model == "v5w"
    got = read_jsonl(g.train_data, "conversation")   # every video path resolves
    assert [e.video for e in got] == [str(data / f"train/train_v2_{i:05d}.mp4") for i in (0, 1)] \
        + [str(more / f"train/train_v2_{i:05d}.mp4") for i in range(3)]
    ids = [json.loads(line)["id"] for line in open(g.train_data)]
    assert len(set(ids)) == 5 and ids[2] == "data_more/train_v2_00000_0"
    f = load_config("tiny_stage3f").to_dict()
    d = g.to_dict()   # Stage 3f's settings but for the paths, the seed and the steps
    assert {k for k in f if f[k] != d[k]} <= {"model", "routers", "train_data", "eval_data",
                                              "output_dir", "seed", "max_steps"}
    assert d["seed"] != f["seed"]


def test_task_v8_is_task_v5_from_a_longer_stage0(tmp_path, monkeypatch, run_train_tiny):
    """Task v8: Stage 0 from tiny_stage0b (tiny_stage0's settings with longer captions), then
    task v5's stages, from scratch only; its final weights are Stage 3f's."""
    import pytest
    from vr_tiny import recipe as tiny_demo
    from vr_tiny.pretrain import PretrainConfig
    assert tiny_demo.LATER_STAGES["v8"] == tiny_demo.LATER_STAGES["v5"]
    assert "v8" not in tiny_demo.FROM_TASK and "v7" not in tiny_demo.LATER_STAGES
    a, b = PretrainConfig.load("tiny_stage0"), PretrainConfig.load("tiny_stage0b")
    diff = {k for k, v in vars(a).items() if vars(b)[k] != v}
    assert diff == {"steps", "output_dir"} and b.steps > a.steps
    seen = []

    def fake_pretrain(cfg, progress=True):
        seen.append(cfg)
        return {"metrics": {}}

    monkeypatch.setattr(tiny_demo, "pretrain", fake_pretrain)
    for task, steps in (("v5", a.steps), ("v8", b.steps)):
        summary = {"stages": {}}
        tiny_demo._stage0(str(tmp_path / task), summary, task)
        assert seen[-1].steps == steps and seen[-1].output_dir == str(tmp_path / task / "stage0")
        name = "tiny_stage0b" if task == "v8" else "tiny_stage0"
        assert summary["stages"]["stage0"]["config"] == f"vr_tiny/configs/{name}.json"
    with pytest.raises(ValueError, match="from_model"):
        tiny_demo.run_tiny(str(tmp_path / "x"), task="v8", from_model="v5w")
    p, calls = run_train_tiny(tmp_path / "sh", "--task", "v8", "w")
    assert p.returncode == 0, p.stderr
    assert arg(calls[0], "--task") == "v8" and "stage3f" in p.stderr


def test_task_v9_is_task_v8_with_color_first_answers(tmp_path, run_train_tiny):
    """Task v9: task v8's Stage 0 and stages; every Stage 3 on answers its shapes color first,
    Stage 3 with dense dialogues and captions from the first step, Stages 3e and 3f with
    captions in their dense dialogues; Stages 1 and 2 as task v8's."""
    from vr_tiny import recipe as tiny_demo
    from vr_tiny.recipe import _stage_config
    assert tiny_demo.LATER_STAGES["v9"] == tiny_demo.LATER_STAGES["v8"]
    assert tiny_demo.STAGE0_CONFIGS["v9"] == tiny_demo.STAGE0_CONFIGS["v8"]
    assert "v9" not in tiny_demo.FROM_TASK
    data, work = tmp_path / "data", str(tmp_path / "w")
    data.mkdir()
    (data / "train_conversations.jsonl").write_text('{"video": "a.mp4"}\n')
    for stage in (1, 2, 3, "3b", "3c", "3e", "3f"):
        v8 = flat(_stage_config(stage, str(data), work, "base", "r", "v8"))
        v9 = flat(_stage_config(stage, str(data), work, "base", "r", "v9"))
        changed = {k for k in v8 if v8[k] != v9[k]}
        if stage in (1, 2):
            assert changed == set()
            continue
        assert v9["color_first_answers"] and not v8["color_first_answers"]
        assert (v9["caption_turn_prob"] == 0.5) == (stage in (3, "3e", "3f"))
        assert (stage == 3) == ("dense_plan_prob" in changed)
        assert changed <= {"color_first_answers", "caption_turn_prob", "dense_plan_prob",
                           "dense_plan_frames", "dense_plan_keep_relevant",
                           "dense_plan_dialogue"}
    p, calls = run_train_tiny(tmp_path / "sh", "--task", "v9", "w")
    assert p.returncode == 0, p.stderr
    assert arg(calls[0], "--task") == "v9" and "stage3f" in p.stderr
