"""`accelerate launch --num_processes 2 -m vr_runtime.eval ...` on CPU (two gloo processes):
videos sharded over the ranks, gathered on rank 0, the same predictions as one process."""
import json
import os
import shutil
import socket
import subprocess

import pytest


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _preds(out):
    rows = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    timings = ("ttft_s", "ttft_cached_s", "ttft_added_back_s")     # timings differ
    return [{k: v for k, v in p.items() if k not in timings} for p in rows]


def test_two_gloo_processes_match_one(synth_bench, tmp_path, capsys):
    from eval_helpers import run_cli
    accelerate = shutil.which("accelerate")
    if accelerate is None:
        pytest.fail("the accelerate launcher is part of the default install")
    args = ["-m", "vr_runtime.eval", "--benchmark", "videomme", "--data", synth_bench["data"],
            "--videos", synth_bench["videos"], "--methods", "uniform,auto", "--budgets", "512",
            "--frames", "2,4", "--answer-mode", "option-text", "--no-progress",
            "--max-new-tokens", "3"]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TRITON_INTERPRET", None)
    status, _, err = run_cli(args[2:] + ["--out", tmp_path / "one"], capsys)   # in-process
    assert status == 0, err
    # --multi_gpu is accelerate's multi-process (torchrun) launcher; on a CPU-only machine the
    # runner asks for gloo (PartialState(cpu=True)).
    two = subprocess.run([accelerate, "launch", "--num_processes", "2", "--multi_gpu",
                          "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend",
                          "no", "--main_process_port", str(_port())] + args +
                         ["--out", str(tmp_path / "two")], env=env, capture_output=True,
                         text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-2000:]
    res = json.loads((tmp_path / "two" / "results.json").read_text())
    assert res["meta"]["processes"] == 2
    assert _preds(tmp_path / "two") == _preds(tmp_path / "one")
    assert len(_preds(tmp_path / "one")) == 2 * 2 * synth_bench["questions"]   # 2 methods x 2 frame counts
    assert not list((tmp_path / "two").glob("predictions.part*.jsonl"))
