"""bench/gpu_run.sh, the prepared GPU command, dry-run on CPU: every stage's command line is
parsed by its own script, the archive and the summary are made, and a bad flag fails here
instead of in the first minute of device time."""
import json
import os
import pathlib
import re
import subprocess
import tarfile

import pytest

from bench import check_args
from bench.harness.results import runs_of
from bench.report import gpu_summary

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_run.sh"

TUNE = ["fast", "decode_cold", "decode_warm", "train_2b", "train_8b", "tests", "video"]
MAIN = ["e2e", "kernels", "decode", "batch", "frames", "tests", "video"]
EXTRA = ["frames_1024", "decode_inductor", "cold_tiny", "cold_8b"]


def _dry(tmp_path, *args, script=SCRIPT):
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), TMPDIR=str(tmp_path), GPU_RUN_ROOT=str(ROOT))
    r = subprocess.run(["bash", str(script), "--dry-run", *args], capture_output=True,
                       text=True, env=env, timeout=240)
    return r, out


def _stages(text):
    """(name, cap) of each ``stage`` line of the script: the tune, main and extra parts."""
    body = text.replace("\\\n", " ")
    a, b = body.index("stage e2e "), body.index("stage frames_1024")   # main's, extra's first
    pick = re.compile(r"^\s*stage (\w+) (\d+) ", re.M)
    return tuple([(n, int(c)) for n, c in pick.findall(part)]
                 for part in (body[:a - 4], body[a - 4:b - 4], body[b - 4:]))


def test_dry_run_checks_every_stage_and_leaves_one_archive_and_the_summary(tmp_path):
    r, out = _dry(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["gpu_rows.tgz", "summary.md"]
    summary = (out / "summary.md").read_text()
    for name in MAIN:
        assert re.search(rf"^\| {name} \| .*dry-run: arguments ok", summary, re.M), name
    assert "pending (stage e2e)" in summary
    # the summary table is the last thing printed: a killed run still shows it
    assert r.stdout.rstrip().endswith(summary.rstrip().splitlines()[-1])
    with tarfile.open(out / "gpu_rows.tgz") as t:
        names = set(t.getnames())
    assert {"./stages.tsv", "./environment.json", "./summary.md", "./logs/e2e.cmd"} <= names


def test_a_bad_flag_fails_the_dry_run_and_names_its_stage(tmp_path):
    text = SCRIPT.read_text()
    assert "--sweep-frames 128,512,1024" in text
    bad = tmp_path / "gpu_run.sh"
    bad.write_text(text.replace("--sweep-frames 128,512,1024", "--sweep-framez 128,512,1024"))
    r, out = _dry(tmp_path, "extra", script=bad)
    assert r.returncode == 2
    summary = (out / "summary_extra.md").read_text()
    assert re.search(r"^\| frames_1024 \| .*BAD ARGUMENTS: .*--sweep-framez", summary, re.M)
    assert re.search(r"^\| cold_8b \| .*arguments ok", summary, re.M)
    assert sorted(p.name for p in out.iterdir()) == ["gpu_extra.tgz", "summary_extra.md"]


@pytest.mark.parametrize("argv, msg", [
    (["python3", "-m", "bench.scripts.bench_e2e", "--runz", "3"], "--runz"),
    (["python3", "-m", "bench.scripts.bench_e2e", "--policies", "dense,vr99"], "vr99"),
    (["python3", "-m", "bench.scripts.bench_pool_pack", "--methods", "kernel,cpy"], "cpy"),
    (["python3", "-m", "bench.scripts.bench_decode", "--modes", "grph"], "grph"),
    (["python3", "-m", "bench.scripts.bench_cold_start", "--shape", "9b"], "9b"),
    (["python3", "-m", "bench.scripts.bench_video", "nvdec", "--frames", "64,x"], "--frames"),
    (["python3", "-m", "bench.scripts.bench_nope"], "no argument check"),
    (["python3", "bench/scripts/bench_e2e.py"], "not a 'python3 -m bench.scripts.SCRIPT"),
])
def test_check_command_names_what_is_wrong(argv, msg):
    why = check_args.check_command(argv)
    assert msg in why and "\n" not in why


def test_the_prepared_commands_parse_as_on_the_gpu():
    assert check_args.check_command(["python3", "-m", "bench.scripts.bench_decode", "--modes",
                                     "dynamic,graph"]) == ""


def test_stages_in_order_of_value_and_caps_within_the_budgets():
    tune, main, extra = _stages(SCRIPT.read_text())
    assert [n for n, _ in main] == MAIN and [n for n, _ in extra] == EXTRA
    assert [n for n, _ in tune] == TUNE
    assert sum(c for _, c in main) <= 390 and sum(c for _, c in extra) <= 280
    # tune: one device call of at most 9 minutes; its budget skips what would not fit
    assert sum(c for n, c in tune if n not in ("tests", "video")) <= 530


def test_tune_dry_run_checks_every_stage(tmp_path):
    r, out = _dry(tmp_path, "tune")
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["gpu_tune.tgz", "summary_tune.md"]
    summary = (out / "summary_tune.md").read_text()
    for name in TUNE:
        assert re.search(rf"^\| {name} \| .*dry-run: arguments ok", summary, re.M), name
    assert "| vision tower, ms a frame | <= 1.1 (floor 0.91) | pending (stage fast) |" in summary


def test_tune_summary_reads_its_files(tmp_path):
    """The tune rows from files shaped as the tune part writes them."""
    vision = [dict(variant="today (eager, chunks of 16)", ms_per_frame=1.79),
              dict(variant="cudagraphs, chunk 32", ms_per_frame=1.02),
              dict(variant="inductor, chunk 16", error="RuntimeError: x")]
    router = [dict(variant="today (eager), pool 1", pool=1, ms_per_frame=1.01),
              dict(variant="cudagraphs, pool 1", pool=1, ms_per_frame=0.75)]
    ttft = [dict(settings=s, policy=p, frames=f, ttft_s=t, ratio_to_dense=x,
                 floor_ratio_tokens=0.46, peak_total_gb=m)
            for s, p, f, t, x, m in [("today", "videorouter", 64, 0.4, 0.66, 19.5),
                                     ("today", "dense", 64, 0.61, None, 19.4),
                                     ("tuned", "videorouter", 64, 0.29, 0.55, 19.0),
                                     ("tuned", "dense", 64, 0.53, None, 19.4),
                                     ("tuned", "videorouter", 1024, 1.9, None, 20.0)]]
    (tmp_path / "fast_path_gpu_8b.json").write_text(
        json.dumps(dict(vision=vision, router=router, ttft=ttft)))
    dec = lambda c: dict(rows=[dict(mode="graph", batch=1, ms_per_token=4.8, compile_s=c)])
    (tmp_path / "decode_cold_gpu_8b.json").write_text(json.dumps(dec(35.0)))
    (tmp_path / "decode_warm_gpu_8b.json").write_text(json.dumps(dec(4.2)))
    (tmp_path / "train_gpu_2b.json").write_text(json.dumps(dict(rows=[
        dict(stage=3, backend="kernel", step_s=0.9, peak_step_gb=10.0),
        dict(stage=3, backend="reference", step_s=1.0, peak_step_gb=12.5)])))
    text = gpu_summary.summary(str(tmp_path), "tune")
    for row, got in [("vision tower", "today 1.79; best 1.02 (cudagraphs, chunk 32)"),
                     ("router, ms a frame, pool 1", "today 1.01; best 0.75"),
                     ("router, ms a frame, pool 2", "pending (stage fast)"),
                     ("TTFT at 64", "today 0.400 s; tuned 0.290 s"),
                     ("TTFT VideoRouter / Dense", "tuned 0.55x (tokens 0.46x)"),
                     ("TTFT at 1,024", "tuned 1.900 s"), ("peak memory", "tuned 0.98x"),
                     ("decode per token", "graph 4.80 ms"), ("graph decoding's compile", "35.0 s / 4.2 s"),
                     ("Stage 3 step", "2b 0.90x time, 0.80x memory")]:
        assert re.search(rf"^\| {re.escape(row)}.*\| .*{re.escape(got)}", text, re.M), (row, text)


def test_unknown_argument_is_one_line():
    r = subprocess.run(["bash", str(SCRIPT), "nope"], capture_output=True, text=True)
    assert r.returncode == 2 and "expected [--dry-run] [tune|main|extra]" in r.stderr


def test_summary_reads_the_results_files(tmp_path):
    """The readers on the 2026-11-24 H100 files (renamed as the run names them) give the
    figures that run published."""
    src = ROOT / "bench" / "results" / "gpu_h100_2026-11-24"
    for a, b in [("e2e_gpu_8b", "e2e_gpu_8b"), ("e2e_gpu_8b_batch", "e2e_gpu_8b_batch"),
                 ("e2e_gpu_8b_frames", "e2e_gpu_8b_frames"), ("pool_pack_gpu", "pool_pack_gpu_8b")]:
        first = runs_of(json.loads((src / f"{a}.json").read_text()))[0]   # the run it published
        (tmp_path / f"{b}.json").write_text(json.dumps(first))
    text = gpu_summary.summary(str(tmp_path))
    for row, got in [("TTFT VideoRouter (2,4) / Dense", "0.68"), ("router share", "16.0%"),
                     ("peak memory", "1.01"), ("pool_pack", "88 / 65"), ("4 videos", "3.08x"),
                     ("TTFT ratio at 256 frames", "0.32"), ("decode per token", "pending (stage decode)")]:
        assert re.search(rf"^\| {re.escape(row)}.*\| {re.escape(got)}", text, re.M), row


def test_summary_reads_the_h200_run_and_says_why_a_ratio_is_missing(tmp_path):
    """The 2026-11-28 H200 files: Dense was refused at 256 frames (past the model's context), so
    the 256-frame row names the refusal instead of failing on the missing ratio."""
    src = ROOT / "bench" / "results" / "gpu_h200_2026-11-28"
    for name in ("e2e_gpu_8b", "e2e_gpu_8b_batch", "e2e_gpu_8b_frames", "pool_pack_gpu_8b",
                 "decode_gpu_8b"):
        (tmp_path / f"{name}.json").write_text((src / f"{name}.json").read_text())
    text = gpu_summary.summary(str(tmp_path))
    for row, got in [("TTFT VideoRouter (2,4) / Dense", "0.66"), ("pool_pack", "116 / 112"),
                     ("4 videos", "2.78x"), ("decode per token", "dynamic 19.2 ms"),
                     ("TTFT ratio at 256 frames", "no Dense row (BudgetError")]:
        assert re.search(rf"^\| {re.escape(row)}.*\| {re.escape(got)}", text, re.M), row
