"""The lmms-eval plugin against the real lmms-eval package (0.7.x, installed by .ci/run with
--no-deps plus the few dependencies of its import path): the commands docs/evaluation.md gives, in
order -- `python -m vr_runtime.eval.lmms_tasks` writes the shipped `videorouter_videomme` task
for a local Video-MME copy (here the synthetic benchmark in Video-MME layout) and prints the
lmms-eval command; that command finds the model through the `lmms_eval.models` entry point and
the task through --include_path, answers with the tiny model on CPU, offline and without
OpenCV, and logs the visual tokens of every sample."""
import json
import os
import pathlib
import shlex
import subprocess
import sys

import pytest

lmms_eval = pytest.importorskip("lmms_eval", reason="pip install --no-deps lmms-eval==0.7.3 "
                                "&& pip install -e '.[lmms]' (see docs/evaluation.md)")
ROOT = pathlib.Path(__file__).resolve().parents[2]
ENTRY = "vr_runtime.eval.lmms_plugin:manifest"


def _entry_point_dir(tmp_path):
    """Where lmms-eval's registry will find our entry point: the installed distribution's own
    metadata when `pip install -e .` registered it, else (a checkout not installed) a
    dist-info folder carrying the same line as pyproject.toml."""
    from importlib.metadata import entry_points
    if any(ep.value == ENTRY for ep in entry_points(group="lmms_eval.models")):
        return None
    d = tmp_path / "ep" / "videorouter_checkout-0.0.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: videorouter-checkout\nVersion: 0.0\n")
    (d / "entry_points.txt").write_text(f"[lmms_eval.models]\nvideorouter = {ENTRY}\n")
    return d.parent


def test_pyproject_registers_the_plugin():
    tomllib = pytest.importorskip("tomllib")          # Python >= 3.11
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["entry-points"]["lmms_eval.models"]["videorouter"] == ENTRY
    assert "lmms" in meta["optional-dependencies"]
    from lmms_eval.models.registry_v2 import ModelRegistryV2
    from vr_runtime.eval.lmms_plugin import manifest
    reg = ModelRegistryV2()
    reg.register_manifest(manifest())
    cls = reg.get_model_class("videorouter")          # lmms-eval's own class checks
    assert cls.__name__ == "VideoRouterLMM" and cls.is_simple is False


def _env(tmp_path):
    ep = _entry_point_dir(tmp_path)
    path = [str(ROOT)] + ([str(ep)] if ep else []) + [os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               HF_HOME=str(tmp_path / "hf"), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join(path))
    env.pop("TRITON_INTERPRET", None)
    return env


def test_task_writer_checks_its_input(synth_bench, tmp_path):
    from vr_runtime.eval.lmms_tasks import main
    out = tmp_path / "task"
    assert main(["--data", synth_bench["data"], "--videos", str(tmp_path / "nowhere"),
                 "--out", str(out)]) == 2
    assert not out.exists()                      # nothing written for bad input
    empty = tmp_path / "novideos"
    empty.mkdir()
    assert main(["--data", synth_bench["data"], "--videos", str(empty), "--out", str(out)]) == 2
    assert main(["--data", synth_bench["data"], "--videos", str(empty), "--out", str(out),
                 "--skip-missing"]) == 0         # every question skipped: an empty task
    assert (out / "videomme.jsonl").read_text() == ""


def test_lmms_eval_runs_videorouter(synth_bench, tmp_path, capsys):
    import pyarrow.parquet as pq
    from vr_runtime.eval.lmms_tasks import main
    n = pq.read_metadata(synth_bench["data"]).num_rows
    env = _env(tmp_path)
    task = tmp_path / "task"
    log = tmp_path / "visual_tokens.jsonl"
    model_args = (f"pretrained=tiny,policy=auto,max_length=1400,num_frames=6,device=cpu,"
                  f"visual_tokens_log={log}")
    capsys.readouterr()
    code = main(["--data", synth_bench["data"], "--videos", synth_bench["videos"], "--out",
                 str(task), "--answer-mode", "option-text", "--model-args", model_args])
    w = capsys.readouterr()
    assert code == 0, w.err[-3000:]
    assert f"{n} questions" in w.err
    cmd = shlex.split(w.out.strip())             # the printed command, run as printed
    assert cmd[:3] == ["python", "-m", "lmms_eval"] and "--include_path" in cmd
    # lmms-eval's own videomme utils import cv2; ours must not need it
    env["PYTHONPATH"] = os.pathsep.join([str(_no_cv2(tmp_path)), env["PYTHONPATH"]])
    p = subprocess.run([sys.executable] + cmd[1:], env=env, capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert "videorouter_videomme" in p.stdout and "accuracy" in p.stdout
    assert "Error during evaluation" not in p.stderr, p.stderr[-3000:]
    recs = [json.loads(x) for x in log.read_text().splitlines()]
    assert sorted(r["doc_id"] for r in recs) == list(range(n))
    for r in recs:
        assert r["policy"] in ("global", "fragment") and r["frames"] == 6 == len(r["windows"])
        assert 0 < r["visual_tokens"] <= r["budget"] < r["dense_visual_tokens"]
    assert (p.stdout + p.stderr).count("videorouter sample videorouter_videomme/") == n
    results = list((task / "results").rglob("*results.json"))
    assert results, "lmms-eval wrote no results file"
    acc = json.loads(results[0].read_text())["results"]["videorouter_videomme"]
    assert 0.0 <= acc["accuracy,none"] <= acc["answered,none"] <= 1.0


def _no_cv2(tmp_path):
    """A path entry whose ``cv2`` fails to import, as on a fresh install without OpenCV."""
    d = tmp_path / "no_cv2"
    d.mkdir(exist_ok=True)
    (d / "cv2.py").write_text("raise ImportError(\"No module named 'cv2'\")\n")
    return d


def test_clip_mode_follows_evals_clip_methods(tmp_path):
    """model_args clip=PATH is token-matched CLIP by default (eval's `clip`, the paper's
    protocol); clip_mode=fill is eval's `clip-fill`; a bad mode fails before the model loads."""
    from vr_runtime.eval.lmms_model import VideoRouterLMM
    from vr_runtime.eval.synthetic import make_random_clip
    from vr_runtime.routing.scorers import CLIPScorer, TokenMatchedScorer
    clip = make_random_clip(tmp_path / "clip")
    with pytest.raises(ValueError, match="clip_mode 'top'"):
        VideoRouterLMM(pretrained="no-such-model", clip=clip, clip_mode="top", device="cpu")
    matched = VideoRouterLMM(pretrained="tiny", clip=clip, device="cpu")
    assert isinstance(matched.scorer, TokenMatchedScorer)
    assert isinstance(matched.scorer.inner, CLIPScorer)
    fill = VideoRouterLMM(pretrained="tiny", clip=clip, clip_mode="fill", device="cpu")
    assert type(fill.scorer) is CLIPScorer


def test_seek_and_time_window_model_args():
    """model_args seek= and time_window=START:END (commas split model_args) are checked before
    the model loads."""
    from vr_runtime.eval.lmms_model import VideoRouterLMM, _time_window
    assert _time_window("600:900") == (600.0, 900.0) and _time_window(None) is None
    for bad in ("900:600", "a:b", "5"):
        with pytest.raises(ValueError, match="time_window"):
            _time_window(bad)
    with pytest.raises(ValueError, match="seek 'nearest'"):
        VideoRouterLMM(pretrained="no-such-model", seek="nearest", device="cpu")
    with pytest.raises(ValueError, match="time_window"):
        VideoRouterLMM(pretrained="no-such-model", time_window="1:0", device="cpu")
