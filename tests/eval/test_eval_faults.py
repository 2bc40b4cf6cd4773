"""`videorouter eval` under faults (issue 28) and its quick path's reporting (issue 24): a bad
video among good ones, a full disk, missing or torn settings, SIGKILL at random points, torn
prediction files, the `unanswered` / `failed` columns, the parser note and "resuming: N of M".

Runs are small (uniform + auto at one budget, 2 frames, 12 questions: 24 answers); the
uninterrupted reference run is made once per module and copied."""
import builtins
import errno
import io
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from eval_helpers import counting_answers, failing_decode, run_cli

METHODS = "uniform,auto"


def argv_for(bench, out, videos=None):
    return ["--benchmark", "videomme", "--data", bench["data"], "--videos",
            videos or bench["videos"], "--methods", METHODS, "--budgets", "256", "--frames", 2,
            "--answer-mode", "option-text", "--prompt-style", "bare", "--max-new-tokens", 2,
            "--out", out, "--no-progress"]


def timeless(obj):
    """Results without what depends on the clock (timings, the date) or on the cache state."""
    if isinstance(obj, dict):
        return {k: timeless(v) for k, v in obj.items()
                if "ttft" not in k and not k.endswith("_s") and k not in ("date", "visual_cache")}
    if isinstance(obj, list):
        return [timeless(v) for v in obj]
    return obj


def results_of(out):
    res = json.loads((out / "results.json").read_text())
    preds = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    return timeless(res["rows"]), timeless(preds)


@pytest.fixture(scope="module")
def reference(synth_bench, tmp_path_factory):
    """One uninterrupted run: (out, its timeless rows and predictions)."""
    out = tmp_path_factory.mktemp("ref") / "out"
    from vr_runtime.cli import main
    assert main(["eval"] + [str(a) for a in argv_for(synth_bench, out)]) == 0
    return out, results_of(out)


def error_lines(err):
    """stderr without the progress lines: a failure must be exactly one line."""
    return [x for x in err.strip().splitlines() if not x.startswith("resuming: ")]


def copy_of(reference, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(reference[0], out)
    return out


# ------------------------------------------------------------------ a bad video among good ones
@pytest.mark.parametrize("skip_missing", [False, True])
def test_a_truncated_video_does_not_stop_the_run(synth_bench, reference, tmp_path, capsys,
                                                 monkeypatch, skip_missing):
    videos = tmp_path / "v"
    shutil.copytree(synth_bench["videos"], videos)
    bad = sorted(videos.iterdir())[1]                 # the middle one: good videos either side
    good_bytes = bad.read_bytes()
    bad.write_bytes(good_bytes[:len(good_bytes) // 2])
    out = tmp_path / "o"
    argv = argv_for(synth_bench, out, videos) + (["--skip-missing"] if skip_missing else [])
    status, stdout, err = run_cli(argv, capsys)
    assert status == 0, err
    preds = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    failed = [p for p in preds if p.get("failed")]
    ids = {p["id"] for p in failed}
    assert failed and all(p["video"] == bad.name and "not a readable video" in p["failed"]
                          for p in failed)
    assert len(preds) == 2 * synth_bench["questions"]           # every question is recorded
    res = json.loads((out / "results.json").read_text())
    for r in res["rows"]:
        assert r["failed"] == len(ids) and r["n"] == synth_bench["questions"] - len(ids)
        ok = [p for p in preds if p["method"] == r["method"] and not p.get("failed")]
        assert r["accuracy"] == pytest.approx(100 * sum(p["correct"] for p in ok) / len(ok),
                                              abs=0.01)
    assert {q["id"] for q in res["meta"]["failed_questions"]} == ids
    assert res["meta"]["failed"] == len(ids)
    md = (out / "results.md").read_text()
    assert "| Failed |" in md and f"| {len(ids)} |" in md
    assert "Failed" in (out / "results.csv").read_text().splitlines()[0]
    assert stdout.strip().splitlines()[-1].startswith(f"failed: {len(ids)} question(s)")
    assert bad.name in err
    # The good videos' answers are those of a run without the bad one.
    ref_preds = {(p["id"], p["method"]): p for p in reference[1][1]}
    for p in timeless(preds):
        if not p.get("failed"):
            assert p == ref_preds[(p["id"], p["method"])]
    # A rerun retries the failed questions (and only them); repaired, they are answered.
    bad.write_bytes(good_bytes)
    calls = counting_answers(monkeypatch)
    status, stdout, err = run_cli(argv, capsys)
    assert status == 0, err
    assert sorted(calls) == sorted((p["id"], p["method"], p["budget"]) for p in failed)
    assert "failed:" not in stdout
    assert results_of(out) == reference[1]


def test_a_video_failing_while_its_frames_stream(synth_bench, tmp_path, capsys,
                                                          monkeypatch):
    """The other way a video fails: the cheap checks pass, decoding its frames raises."""
    from vr_runtime.video import stream
    bad_name = sorted(pathlib.Path(synth_bench["videos"]).iterdir())[0].name
    monkeypatch.setattr(stream, "decode_frames", failing_decode(bad_name))
    status, stdout, err = run_cli(argv_for(synth_bench, tmp_path / "o"), capsys)
    assert status == 0, err
    res = json.loads((tmp_path / "o" / "results.json").read_text())
    assert res["meta"]["failed"] > 0
    assert all("RuntimeError: decoder crashed at frame 7" in q["reason"]
               for q in res["meta"]["failed_questions"])
    assert "failed: " in stdout.strip().splitlines()[-1]


# ------------------------------------------------------------------------------ a full disk
class _NoSpace:
    """A file whose every write fails as on a full disk (``[Errno 28]``, no file name)."""

    def __init__(self, fh):
        self._fh = fh

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self._fh, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._fh.close()


def full_disk(monkeypatch, full):
    """Writes to files for which ``full(path)`` holds fail with ENOSPC (the file is created
    first, as on a real full disk). Covers ``open`` and ``pathlib``'s ``io.open``."""
    real = builtins.open

    def opener(file, mode="r", *a, **kw):
        fh = real(file, mode, *a, **kw)
        if isinstance(file, (str, os.PathLike)) and set(mode) & set("wax+") \
                and full(pathlib.Path(file)):
            return _NoSpace(fh)
        return fh

    monkeypatch.setattr(builtins, "open", opener)
    monkeypatch.setattr(io, "open", opener)


def snapshot(out):
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def test_full_disk_names_the_file_and_keeps_a_consistent_set(reference, synth_bench, tmp_path,
                                                             capsys, monkeypatch):
    out = copy_of(reference, tmp_path)
    lines = (out / "predictions.jsonl").read_text().splitlines()
    (out / "predictions.jsonl").write_text("\n".join(lines[:-3]) + "\n")   # 3 to redo
    before = snapshot(out)
    argv = argv_for(synth_bench, out)
    # 1. Full while answering: the append to the part file fails.
    with monkeypatch.context() as m:
        full_disk(m, lambda p: p.parent == out)
        status, _, err = run_cli(argv, capsys)
    assert status == 2 and len(error_lines(err)) == 1, err
    assert str(out / "predictions.part0.jsonl") in err and "No space left" in err
    left = snapshot(out)
    assert not [n for n in left if ".tmp" in n]
    assert {n: b for n, b in left.items() if "part" not in n} == before
    # 2. Full while writing the results (the third of five files): nothing is replaced.
    with monkeypatch.context() as m:
        full_disk(m, lambda p: p.name.startswith("results.md"))
        status, _, err = run_cli(argv, capsys)
    assert status == 2 and len(error_lines(err)) == 1, err
    assert str(out / "results.md") in err and "No space left" in err
    left = snapshot(out)
    assert not [n for n in left if ".tmp" in n], sorted(left)
    assert {n: b for n, b in left.items() if "part" not in n} == before
    assert len(left["predictions.part0.jsonl"].splitlines()) == 3      # the redone answers
    # 3. Space again: the rerun completes the set without answering anything again.
    calls = counting_answers(monkeypatch)
    status, _, err = run_cli(argv, capsys)
    assert status == 0, err
    assert calls == []
    assert results_of(out) == reference[1]
    assert not list(out.glob("*.tmp")) and not list(out.glob("predictions.part*"))


def test_write_files_atomically_is_all_or_nothing(tmp_path, monkeypatch):
    from vr_runtime.data.atomic import write_files_atomically
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    write_files_atomically({a: "old a", b: b"old b"})
    with monkeypatch.context() as m:
        full_disk(m, lambda p: p.name == "b.txt.tmp")
        with pytest.raises(OSError) as e:
            write_files_atomically({a: "new a", b: "new b"})
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(b)
    assert (a.read_text(), b.read_text()) == ("old a", "old b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]
    write_files_atomically({a: "new a", b: lambda p: p.write_text("new b")})
    assert (a.read_text(), b.read_text()) == ("new a", "new b")


# ---------------------------------------------------------------------- settings.json
@pytest.mark.parametrize("damage,says", [
    (lambda f: f.unlink(), "is missing"),
    (lambda f: f.write_text(f.read_text()[:20]), "cannot be read"),
    (lambda f: f.write_text("[1, 2]"), "is not a JSON object"),
])
def test_missing_or_torn_settings_stop_reuse(reference, synth_bench, tmp_path, capsys,
                                             monkeypatch, damage, says):
    out = copy_of(reference, tmp_path)
    damage(out / "settings.json")
    calls = counting_answers(monkeypatch)
    status, _, err = run_cli(argv_for(synth_bench, out), capsys)
    assert status == 2 and len(error_lines(err)) == 1, err
    assert f"settings.json {says}" in err and "another --out" in err
    assert calls == []
    # Without predictions there is nothing to mix up: the settings are written afresh.
    for f in out.glob("predictions*.jsonl"):
        f.unlink()
    status, _, err = run_cli(argv_for(synth_bench, out), capsys)
    assert status == 0, err
    assert json.loads((out / "settings.json").read_text())["prompt_style"] == "bare"


def test_other_settings_or_retrained_weights_stop_reuse(reference, synth_bench, tmp_path, capsys,
                                                        monkeypatch):
    out = copy_of(reference, tmp_path)
    calls = counting_answers(monkeypatch)
    argv = argv_for(synth_bench, out)
    status, _, err = run_cli([a if a != "bare" else "mc" for a in argv], capsys)
    assert status == 2 and len(error_lines(err)) == 1, err
    assert "other settings (prompt_style: 'bare' there, 'mc' now); use another --out" in err
    # The tiny preset's weights retrained in place (train_tiny.sh --install): same name, other
    # weights, so the old predictions must not be reused.
    import vr_runtime.fingerprint as fp
    from vr_runtime.backbones.tiny import ASSETS
    retrained = tmp_path / "assets"
    shutil.copytree(ASSETS, retrained)
    data = bytearray((retrained / "routers.safetensors").read_bytes())
    data[-5] ^= 0xFF    # one byte of the last tensor
    (retrained / "routers.safetensors").write_bytes(bytes(data))
    monkeypatch.setattr(fp, "_preset_dir", lambda name: retrained)
    status, _, err = run_cli(argv, capsys)
    assert status == 2 and len(error_lines(err)) == 1, err
    assert "other settings (weights: {'model': '" in err and "another --out" in err
    # a settings.json written before the weights were recorded: not reused either
    monkeypatch.undo()
    calls = counting_answers(monkeypatch)
    settings = json.loads((out / "settings.json").read_text())
    del settings["weights"]
    (out / "settings.json").write_text(json.dumps(settings))
    status, _, err = run_cli(argv, capsys)
    assert status == 2 and "(weights: 'not recorded' there" in err, err
    assert calls == []


# ---------------------------------------------------- SIGKILL at random points, torn files
def _spawn_eval(argv, log):
    env = dict(os.environ)
    env.pop("VIDEOROUTER_DEBUG", None)
    # The same intra-op thread count as this process: the same floating-point sums.
    env["OMP_NUM_THREADS"] = str(torch.get_num_threads())
    return subprocess.Popen([sys.executable, "-m", "vr_runtime.eval", *map(str, argv)],
                            env=env, stdout=log, stderr=log)


def _lines(path):
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def test_sigkill_at_random_points_then_resume_gives_the_same_table(reference, synth_bench,
                                                                   tmp_path, capsys):
    seed = int(os.environ.get("VR_FAULT_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    out = tmp_path / "out"
    argv = argv_for(synth_bench, out)
    part = out / "predictions.part0.jsonl"
    total = len(reference[1][1])
    kills = []
    # First kill: while answering, after 1..total/3 answers are on disk. Second kill: after a
    # random number of the remaining answers and a random delay, so that it can also land in
    # the middle of a write, in the final merge and rename of the results, or after the end.
    for i in range(2):
        start = _lines(part)
        after = rng.randint(1, total // 3) if i == 0 else rng.randint(1, max(1, total - start))
        with open(tmp_path / "log.txt", "ab") as log:
            p = _spawn_eval(argv, log)
            t0 = time.monotonic()
            while _lines(part) < start + after and p.poll() is None:
                assert time.monotonic() - t0 < 120, f"seed {seed}: no progress"
                time.sleep(0.005)
            time.sleep(rng.uniform(0, 0.01) if i == 0 else rng.uniform(0, 0.6))
            p.send_signal(signal.SIGKILL)
            p.wait()
        kills.append(_lines(part))
    assert kills[0] < total, f"seed {seed}: the first run finished before its kill"
    # Resume in this process: the same table as the uninterrupted run, nothing left over.
    status, _, err = run_cli(argv, capsys)
    assert status == 0, f"seed {seed}: {err}"
    assert results_of(out) == reference[1], f"seed {seed}, kills after {kills} lines"
    assert not list(out.glob("predictions.part*")) and not list(out.glob("*.tmp"))


def test_torn_prediction_files_are_redone(reference, synth_bench, tmp_path, capsys, monkeypatch):
    out = copy_of(reference, tmp_path)
    lines = (out / "predictions.jsonl").read_text().splitlines()
    torn_mid, torn_end = json.loads(lines[5]), json.loads(lines[-1])
    # A torn line in the middle of the merged file; a line cut short at the end of a part file.
    (out / "predictions.jsonl").write_text(
        "\n".join(lines[:5] + [lines[5][:17]] + lines[6:-1]) + "\n")
    (out / "predictions.part0.jsonl").write_text(lines[-1][:len(lines[-1]) // 2])
    calls = counting_answers(monkeypatch)
    status, _, err = run_cli(argv_for(synth_bench, out), capsys)
    assert status == 0, err
    assert sorted(calls) == sorted((p["id"], p["method"], p["budget"])
                                   for p in (torn_mid, torn_end))
    assert f"resuming: {len(lines) - 2} of {len(lines)} done" in err
    assert results_of(out) == reference[1]


def test_appending_after_a_torn_part_line_starts_a_new_line(reference, synth_bench, tmp_path,
                                                           capsys, monkeypatch):
    """A new answer appended after a line cut short must not be glued to it (and lost)."""
    out = copy_of(reference, tmp_path)
    lines = (out / "predictions.jsonl").read_text().splitlines()
    (out / "predictions.jsonl").write_text("\n".join(lines[:-2]) + "\n")
    (out / "predictions.part0.jsonl").write_text(lines[-2][:30])
    with monkeypatch.context() as m:      # stop before the merge: the part file stays
        full_disk(m, lambda p: p.name.startswith("results.json"))
        status, _, err = run_cli(argv_for(synth_bench, out), capsys)
    assert status == 2, err
    part = (out / "predictions.part0.jsonl").read_text().splitlines()
    assert part[0] == lines[-2][:30] and len(part) == 3
    assert [timeless(json.loads(x)) for x in part[1:]] == reference[1][1][-2:]


def test_resumed_progress_bar_starts_at_what_is_done(reference, synth_bench, tmp_path, capsys):
    out = copy_of(reference, tmp_path)
    lines = (out / "predictions.jsonl").read_text().splitlines()
    (out / "predictions.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    argv = [a for a in argv_for(synth_bench, out) if a != "--no-progress"]
    status, _, err = run_cli(argv, capsys)
    assert status == 0, err
    n = len(lines)
    assert f"resuming: {n - 1} of {n} done" in err
    assert f"{n - 1}/{n}" in err and f" 0/{n}" not in err, err


# ------------------------------------------------------------- tables and the parser note
def _pred(method, correct, prediction="A", failed=None, **kw):
    p = {"id": kw.pop("id", "q"), "method": method, "budget": 256, "frames": 2,
         "prediction": None if failed else prediction, "answer": "A", "correct": correct,
         "visual_tokens": 100, "ttft_s": 0.1, "policy": "uniform", "category": "c",
         "duration": "short", "video": "v.mp4"}
    if failed:
        p = {k: p[k] for k in ("id", "method", "budget", "frames", "prediction", "answer",
                               "category", "duration", "video")}
        p.update(failed=failed, correct=False, response=None)
    p.update(kw)
    return p


def test_tables_count_unanswered_and_failed_apart_from_wrong():
    from vr_runtime.eval.methods import parse_methods
    from vr_runtime.eval.tables import aggregate, csv_text, markdown
    preds = [_pred("uniform", True, id="1"), _pred("uniform", False, None, id="2"),
             _pred("uniform", False, "B", id="3"), _pred("uniform", False, failed="bad", id="4"),
             _pred("auto", False, failed="bad", id="4")]
    rows = aggregate(preds, parse_methods("uniform,auto", {}))
    r = {x["method"]: x for x in rows}
    assert (r["uniform"]["n"], r["uniform"]["failed"], r["uniform"]["unanswered"]) == (3, 1, 1)
    assert r["uniform"]["accuracy"] == pytest.approx(100 / 3, abs=0.01)
    assert (r["auto"]["n"], r["auto"]["failed"], r["auto"]["accuracy"]) == (0, 1, None)
    head = csv_text(rows).splitlines()
    assert head[0].split(",")[5:8] == ["Overall", "Unanswered", "Failed"]
    assert head[1].split(",")[5:8] == ["33.3", "1", "1"]
    assert head[2].split(",")[3:8] == ["-", "0", "-", "0", "1"]
    meta = {"benchmark": "b", "model": "m", "questions": 4, "skipped": 0, "prompt_style": "bare",
            "answer_mode": "letter", "device_line": "d", "command": "c"}
    # 1 of 3 right: 33.3% with its 95% Wilson interval
    assert "| uniform | 2 | 256 | 100 | 3 | 33.3 (6.2-79.2) | 1 | 1 |" in markdown(rows, meta)


def test_parser_note_over_a_quarter():
    from vr_runtime.eval.cli import parser_note
    assert parser_note({"answers": 100, "unanswered": 25, "answer_mode": "letter"}) is None
    assert parser_note({"answers": 0, "unanswered": 0, "answer_mode": "letter"}) is None
    note = parser_note({"answers": 100, "unanswered": 26, "answer_mode": "letter"})
    assert "26 of 100" in note and "--answer-mode option-text" in note and "\n" not in note


def test_letter_parsing_of_word_answers_is_reported(synth_bench, tmp_path, capsys):
    """The tiny model answers in words: lmms-eval's letter parsing finds nothing, and the run
    says so in one line (the table alone would show a plausible-looking accuracy)."""
    argv = argv_for(synth_bench, tmp_path / "o")
    argv[argv.index("option-text")] = "letter"
    argv[argv.index("bare")] = "mc"
    status, stdout, err = run_cli(argv + ["--limit", 3], capsys)
    assert status == 0, err
    notes = [line for line in err.splitlines() if "the answer parser found no option" in line]
    assert len(notes) == 1 and "--answer-mode letter" in notes[0]
    assert "| Unanswered |" in stdout


# ------------------------------------------------------------------------ the quick path
def test_make_synthetic_prints_a_quick_meaningful_command(tmp_path, capsys):
    from vr_runtime.eval.cli import build_parser
    status, stdout, err = run_cli(["--make-synthetic", tmp_path / "syn",
                                   "--videos-per-split", 1], capsys)
    assert status == 0, err
    assert "12 questions on 3 videos" in stdout and "(180 answers, " in stdout  # 12 x (1 + 7 x 2)
    cmd = stdout.strip().splitlines()[-1].split()
    assert cmd[:2] == ["videorouter", "eval"]
    a = build_parser().parse_args(cmd[2:])
    # The tiny model's format and length (the defaults, letters and 64 frames at five
    # budgets, would take ~16 minutes and score nothing).
    assert (a.frames, a.budgets, a.answer_mode, a.prompt_style) == \
        ((16,), (1024, 2048), "option-text", "bare")
    assert a.out == str(tmp_path / "syn" / "eval")
    # The printed command runs and the tiny model's answers are parsed (a short slice of it).
    status, stdout, err = run_cli(cmd[2:] + ["--methods", "auto", "--limit", 3,
                                             "--no-progress"], capsys)
    assert status == 0, err
    res = json.loads((tmp_path / "syn" / "eval" / "results.json").read_text())
    assert res["meta"]["answers"] == 6 and res["meta"]["unanswered"] == 0
    assert "the answer parser found no option" not in err
