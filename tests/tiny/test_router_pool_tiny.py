"""scripts/studies/router_pool_tiny.sh: the tiny routers' Stages 1 and 2 at router_pool 1 and 2,
everything else the same (the shipped model, the data, Stage 1's steps), then routing-eval of
each pair on the held-out and footage splits; the time a step of each pool from short runs
made one after the other; --train and --steps change both pools alike, and a bad argument is one
line and exit 2 before anything runs. A fake ``python`` on PATH records the calls and writes an
empty ``--out`` file (nothing is trained)."""
import json
import os
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "studies" / "router_pool_tiny.sh"


def run(folder, *args):
    bindir = folder / "bin"
    bindir.mkdir(parents=True)
    log = folder / "calls.jsonl"
    py = bindir / "python"
    fake = ("import json, pathlib, sys; a = sys.argv[2:]; "
            "open(sys.argv[1], 'a').write(json.dumps(a) + chr(10)); "
            "o = pathlib.Path(a[a.index('--out') + 1]) if '--out' in a else None; "
            "o and (o.parent.mkdir(parents=True, exist_ok=True), o.touch())")
    py.write_text(f"#!/bin/sh\n{json.dumps(sys.executable)} -c {json.dumps(fake)} "
                  f"{json.dumps(str(log))} \"$@\"\n")
    py.chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    p = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True,
                       timeout=60, cwd=str(folder))
    calls = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    return p, calls


def arg(call, name):
    return call[call.index(name) + 1]


def sets(call):
    return dict(x.split("=", 1) for x in call[call.index("--set") + 1:])


def stages(calls):
    return [sets(c) for c in calls if c[:3] == ["-m", "vr_tiny", "stage"]]


def test_both_pools_alike_then_routing_eval_on_both_splits(tmp_path):
    work, res = tmp_path / "w", tmp_path / "r"
    p, calls = run(tmp_path, str(work), str(res))
    assert p.returncode == 0, p.stderr
    synth = calls[0]
    assert synth[:3] == ["-m", "vr_tiny", "synth"] and arg(synth, "--task") == "v2"
    assert (arg(synth, "--train"), arg(synth, "--heldout"), arg(synth, "--footage")) == \
        ("960", "85", "20")
    fill, s1p1, s2p1, s1p2, s2p2, *ab = stages(calls)
    assert fill["max_steps"] == "1" and "router_pool" not in fill
    for pool, s1, s2 in (("1", s1p1, s2p1), ("2", s1p2, s2p2)):
        assert s1["router_pool"] == s2["router_pool"] == pool
        assert s1["model"] == s2["model"] == "tiny"
        assert "max_steps" not in s1 and "max_steps" not in s2   # the configs' own steps
        assert s1["output_dir"] == f"{work}/pool{pool}/stage1"
        assert s2["routers"] == f"{work}/pool{pool}/stage1/routers.safetensors"
    drop = ("router_pool", "output_dir")
    assert {k: v for k, v in s1p1.items() if k not in drop} == \
        {k: v for k, v in s1p2.items() if k not in drop}
    # the time a step: 40 steps of pool 1, 2, 1, 2, one after the other
    assert [(a["router_pool"], a["max_steps"], a["output_dir"]) for a in ab] == [
        (pool, "40", f"{work}/ab/pool{pool}_{r}") for r in (1, 2) for pool in ("1", "2")]
    evals = [c for c in calls if c[:3] == ["-m", "vr_tiny", "routing-eval"]]
    assert [(arg(c, "--routers"), arg(c, "--data"), arg(c, "--out")) for c in evals] == [
        (f"{work}/pool{pool}/stage2/routers.safetensors",
         f"{work}/data/{split}_conversations.jsonl",
         f"{work}/pool{pool}/routing_wide_{split}.json")
        for pool in (1, 2) for split in ("heldout", "footage")]
    assert not any("--no-answers" in c for c in evals)   # answers included
    for pool in (1, 2):   # copied into the results
        assert sorted(p.name for p in (res / f"retrain_pool{pool}").iterdir()) == [
            "routing_wide_footage.json", "routing_wide_heldout.json"]
    # a second run reuses the evaluations (the stages are reused by their metrics.json)
    p, calls = run(tmp_path / "again", str(work), str(res))
    assert p.returncode == 0, p.stderr
    assert not [c for c in calls if c[:3] == ["-m", "vr_tiny", "routing-eval"]]


def test_train_and_steps_change_both_pools_alike(tmp_path):
    p, calls = run(tmp_path, "--train", "480", "--steps=600", str(tmp_path / "w"),
                   str(tmp_path / "r"))
    assert p.returncode == 0, p.stderr
    assert arg(calls[0], "--train") == "480"
    fill, s1p1, _, s1p2, _, *ab = stages(calls)
    assert fill["max_steps"] == "1" and s1p1["max_steps"] == s1p2["max_steps"] == "600"
    assert [a["max_steps"] for a in ab] == ["40"] * 4   # the timing runs keep their 40


def test_bad_arguments_are_one_line_and_exit_2(tmp_path):
    for i, args in enumerate((["--steps", "0"], ["--steps"], ["--train=x"], ["--train", "07"],
                              ["--bogus"], ["a", "b", "c"])):
        p, calls = run(tmp_path / str(i), *args)
        assert p.returncode == 2 and calls == [], args
        assert len(p.stderr.strip().splitlines()) == 1 and "router_pool_tiny.sh" in p.stderr
