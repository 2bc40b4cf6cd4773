"""The `videorouter` command (docs/CONTRACT.md section 4), run as a user runs it: in a subprocess.

Each subprocess imports torch and transformers (about 7 s of a 10-s `ask` on 2 cores), so the
normal path, one bad video, the traceback and the signals run as subprocesses, and the other
docs/CONTRACT.md errors run ``cli.main`` in this process (``cli_here``: the same exit status,
stdout and stderr, the imports already paid)."""
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import torch
import pytest

from vr_runtime import cli, cli_args


SAMPLE = str(cli.SAMPLE_VIDEO)


def videorouter(*args, env=None, timeout=180):
    e = dict(os.environ)
    e.pop("VIDEOROUTER_DEBUG", None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "vr_runtime.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=e)


def assert_usage_error(res, *needles):
    """Exit status 2, exactly one line on stderr naming the problem, no traceback."""
    assert res.returncode == 2, (res.returncode, res.stderr)
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("videorouter: error: "), lines[0]
    assert "Traceback" not in res.stderr and res.stdout == ""
    for n in needles:
        assert n.lower() in lines[0].lower(), (n, lines[0])


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    (d / "empty.mp4").write_bytes(b"")
    (d / "corrupt.mp4").write_bytes(np.random.default_rng(1).bytes(30000))
    (d / "notes.txt").write_text("a text file, not a video\n" * 20)
    from PIL import Image
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(d / "still.png")
    data = open(SAMPLE, "rb").read()
    (d / "truncated.mp4").write_bytes(data[: len(data) // 2])
    (d / "model_dir").mkdir()
    return d


# ----------------------------------------------------------------------------- normal path

def test_demo_json(tmp_path):
    res = videorouter("demo", "--json")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 1, res.stdout  # exactly one JSON object and nothing else on stdout
    out = json.loads(lines[0])
    # "text": the generated answer ("answer" is the ground truth in the data files)
    assert set(out) == {"text", "report", "demo"} and isinstance(out["text"], str)
    # one entry per demo question; the top-level text/report are the first question's
    assert [d["question"] for d in out["demo"]] == list(cli.DEMO_QUESTIONS)
    assert out["demo"][0]["text"] == out["text"] and out["demo"][0]["report"] == out["report"]
    r = out["report"]
    assert "scales" not in r   # the per-frame list is "windows"; "scales" is the triple only
    for key in ("policy", "policy_probability", "frame_indices", "frame_scores", "windows",
                "visual_tokens", "dense_visual_tokens", "budget", "text_tokens", "timings_s",
                "device"):
        assert key in r, key
    assert r["frame_indices"] == list(range(cli.DEMO_FRAMES)) and r["device"] == "cpu"
    assert r["dense_visual_tokens"] == cli.DEMO_FRAMES * 256
    # the demo's budget forces real compression, and the plan respects it
    assert r["visual_tokens"] <= r["budget"] < r["dense_visual_tokens"]
    assert r["visual_tokens"] == sum(r["frame_tokens"])
    assert set(r["timings_s"]) >= {"frames", "vision", "router", "compress", "prefill", "ttft",
                                   "generate"}
    assert r["timings_s"]["frames"] > 0


def test_ask_table_and_plot(tmp_path):
    png = tmp_path / "tokens.png"
    res = videorouter("ask", SAMPLE, "What shape is the red object?", "--frames", "8",
                      "--max-length", "1200", "--max-new-tokens", "4", "--policy", "fragment",
                      "--device", "cpu", "--dtype", "fp32", "--plot", png)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert out.startswith("Answer:")
    assert "frame" in out and "time (s)" in out and "score" in out and "window" in out
    assert "timings (s):" in out and "ttft" in out
    # one table row per sampled frame: frame number, time, a score (fragment), window, tokens
    rows = [ln.split() for ln in out.splitlines()
            if len(ln.split()) == 5 and ln.split()[0].isdigit()]
    assert len(rows) == 8
    from vr_runtime.video.load import sample_indices
    assert [int(r[0]) for r in rows] == sample_indices(16, 8, 2.0)
    assert [float(r[1]) for r in rows] == [i / 2.0 for i in sample_indices(16, 8, 2.0)]
    assert all(0.0 <= float(r[2]) <= 1.0 for r in rows)
    total = [ln for ln in out.splitlines() if ln.split()[:1] == ["total"]]
    assert total and int(total[0].split()[-1]) == sum(int(r[4]) for r in rows)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    from PIL import Image
    with Image.open(png) as im:
        assert im.size[0] > 300 and im.size[1] > 200


def test_ask_time_window_and_seek(cli_here):
    """--time-window samples that part of the video; the report says the seek mode."""
    res = cli_here("ask", SAMPLE, "What shape is the red object?", "--frames", "4",
                   "--time-window", "2,6", "--seek", "exact", "--max-length", "1200",
                   "--max-new-tokens", "2", "--device", "cpu", "--dtype", "fp32", "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)["report"]
    assert report["seek"] == "exact" and report["num_frames_used"] == 4
    assert all(2.0 <= t < 6.0 for t in report["frame_times_s"]), report["frame_times_s"]


def test_time_window_arg():
    assert cli_args.time_window_arg("600,900") == (600.0, 900.0)
    assert cli_args.time_window_arg("10:00,1:00:00.5") == (600.0, 3600.5)
    for bad in ("5", "5,1", "a,b", "-1,4", "1,2,3", "1,inf"):
        with pytest.raises(Exception, match="START"):
            cli_args.time_window_arg(bad)


def test_check_inputs_checks_each_value_in_its_stage(tmp_path):
    from vr_runtime.cli_io import UsageError
    from vr_runtime.errors import ModelFilesError, RouterWeightsError
    args = cli.build_parser().parse_args(["ask", "v.mp4", "q"])
    with pytest.raises(UsageError, match="QUESTION is empty"):
        cli.check_inputs(args, " ")
    cli.check_inputs(args, "q")
    for flag, value, error, needle in (
            ("plot", "x.jpg", UsageError, "--plot 'x.jpg': expected a file name ending in .png"),
            ("plot", str(tmp_path / "no" / "x.png"), UsageError, "does not exist"),
            ("policy", "fragmnet", ValueError, "--policy 'fragmnet': expected one of"),
            ("scorer", "nope", ValueError, "--scorer 'nope'"),
            ("model", str(tmp_path / "none"), ModelFilesError, "--model '"),
            ("routers", str(tmp_path / "r.safetensors"), RouterWeightsError, "no such file")):
        bad = cli.build_parser().parse_args(["ask", "v.mp4", "q"])
        setattr(bad, flag, value)
        with pytest.raises(error, match=needle):
            cli.check_inputs(bad, "q")


def test_demo_parses_to_the_bundled_clip_and_tiny_model():
    args = cli.build_parser().parse_args(["demo", "--policy", "fragment"])
    assert (args.video, args.model, args.routers, args.frames, args.max_length,
            args.max_new_tokens, args.device, args.dtype, args.allow_over_length) == (
        str(cli.SAMPLE_VIDEO), "tiny", None, cli.DEMO_FRAMES, cli.DEMO_MAX_LENGTH,
        cli.DEMO_MAX_NEW_TOKENS, "cpu", "fp32", True)
    opts = cli_args.answer_options(args)
    assert (opts.num_frames, opts.max_length, opts.policy, opts.allow_over_length) == (
        cli.DEMO_FRAMES, cli.DEMO_MAX_LENGTH, "fragment", True)


def test_demo_question_matches_synthetic_task():
    from vr_runtime.data.synthetic_videos import DEMO_QUESTIONS, demo_spec
    assert cli.DEMO_QUESTIONS == (DEMO_QUESTIONS["fragment"], DEMO_QUESTIONS["fragment_2"])
    assert cli.DEMO_FRAMES == demo_spec().num_frames


# ----------------------------------------------------------------------------- CONTRACT errors

@pytest.mark.parametrize("name,needle", [
    ("missing.mp4", "no such file"), ("empty.mp4", "empty"), ("corrupt.mp4", "not a readable"),
    ("notes.txt", "not a video"), ("still.png", "image"), ("truncated.mp4", "truncated"),
])
def test_bad_video(bad_files, name, needle, cli_here):
    run = videorouter if name == "missing.mp4" else cli_here   # one as the user runs it
    assert_usage_error(run("ask", bad_files / name, "What happens?"), needle)


def test_empty_question(cli_here):
    assert_usage_error(cli_here("ask", SAMPLE, "   "), "question")


@pytest.mark.parametrize("args,needle", [
    (["--frames", "0"], "--frames"), (["--max-length", "-5"], "--max-length"),
    (["--time-window", "5,1"], "--time-window"), (["--seek", "nearest"], "--seek"),
    (["--decode-workers", "0"], "--decode-workers"),
])
def test_bad_arguments(args, needle):
    assert_usage_error(videorouter("ask", SAMPLE, "What happens?", *args), needle)


def test_missing_model_files(bad_files, cli_here):
    assert_usage_error(cli_here("ask", SAMPLE, "What happens?", "--model",
                                bad_files / "nowhere"), "--model")
    # a directory without the checkpoint files: reported by the model loader, still one line
    assert_usage_error(cli_here("ask", SAMPLE, "What happens?", "--model",
                                bad_files / "model_dir"), "config.json")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_cuda_absent(cli_here):
    assert_usage_error(cli_here("ask", SAMPLE, "What happens?", "--device", "cuda"), "cuda")


def test_budget_too_small(cli_here):
    assert_usage_error(cli_here("ask", SAMPLE, "What happens?", "--max-length", "200",
                                "--frames", "4"), "budget", "max_length")


def test_router_weights_do_not_match(tmp_path, cli_here):
    import torch
    from safetensors.torch import save_file
    from vr_runtime.routing.routers import FORMAT, RouterConfig
    path = tmp_path / "routers.safetensors"
    # routers trained for a model of a different width (hidden 999; the tiny model has 128)
    save_file({"semantic.weight": torch.zeros(2, 999)}, str(path),
              metadata={"format": FORMAT, "router_config": RouterConfig(hidden_size=999).to_json(),
                        "trained": "true"})
    assert_usage_error(cli_here("ask", SAMPLE, "What happens?", "--routers", path,
                                "--frames", "4"), "router weights", "hidden size")


def test_debug_shows_traceback(bad_files):
    res = videorouter("ask", bad_files / "missing.mp4", "What happens?",
                      env={"VIDEOROUTER_DEBUG": "1"})
    assert res.returncode != 0 and "Traceback" in res.stderr and "VideoError" in res.stderr


def test_internal_error_is_one_line(monkeypatch, capsys, tmp_path):
    """A bug (not a user error) still prints one line, with the debug hint, and exit status 1."""
    def boom(args, *rest):
        raise RuntimeError("something\nbroke")
    monkeypatch.setattr(cli, "run_ask", boom)
    for k in ("TRANSFORMERS_VERBOSITY", "TRANSFORMERS_NO_ADVISORY_WARNINGS",
              "HF_HUB_DISABLE_PROGRESS_BARS", "TOKENIZERS_PARALLELISM"):
        monkeypatch.setenv(k, os.environ.get(k, "x"))  # restored afterwards
    monkeypatch.delenv("VIDEOROUTER_DEBUG", raising=False)
    with warnings.catch_warnings(), pytest.raises(SystemExit) as exc:
        cli.main(["ask", SAMPLE, "What happens?"])
    assert exc.value.code == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "RuntimeError: something broke" in err[0]
    assert "VIDEOROUTER_DEBUG=1" in err[0]


# ----------------------------------------------------------------------------- table / plot data

def test_frame_rows_and_plot(tmp_path):
    from vr_kernels.windows import window_tokens
    from vr_runtime.report import frame_rows, plot_report
    rng = np.random.default_rng(3)
    T = 12
    choices = [0, 1, 2, 4, [2, 4], [1, 3]]
    windows = [choices[i] for i in rng.integers(0, len(choices), T)]
    idx = sorted(rng.choice(300, T, replace=False).tolist())
    scores = rng.random(T).round(4).tolist()
    report = {"frame_indices": idx, "windows": windows, "frame_scores": scores, "fps": 25.0,
              "policy": "fragment", "budget": 2000, "dense_visual_tokens": T * 256}
    rows = frame_rows(report)
    expect = [window_tokens(tuple(w) if isinstance(w, list) else w) for w in windows]
    assert [r["tokens"] for r in rows] == expect
    assert [r["time_s"] for r in rows] == pytest.approx([i / 25.0 for i in idx])
    # one key per frame for its window: the label ("drop" for a frame left out of the prompt)
    assert all(set(r) == {"frame", "time_s", "score", "window", "tokens"} for r in rows)
    assert [r["window"] for r in rows] == [
        "drop" if w == 0 else (f"{w}x{w}" if isinstance(w, int) else f"{w[0]}x{w[1]}")
        for w in windows]
    # the runtime's own per-frame counts and times win over recomputation
    report.update(frame_tokens=[7] * T, frame_times_s=[float(t) for t in range(T)])
    rows = frame_rows(report)
    assert [r["tokens"] for r in rows] == [7] * T and rows[-1]["time_s"] == T - 1
    with pytest.raises(ValueError, match="windows"):
        frame_rows({**report, "windows": windows[:-1]})
    png = plot_report(report, tmp_path / "p.png")
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
