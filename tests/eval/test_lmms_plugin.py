"""The lmms-eval plugin against the real lmms-eval package (0.7.x, installed by .ci/run with
--no-deps plus the few dependencies of its import path): `python -m lmms_eval --model
videorouter` finds the model through the `lmms_eval.models` entry point, answers a small local
task (the synthetic Video-MME-layout benchmark) with the tiny model on CPU, and logs the visual
tokens of every sample."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

lmms_eval = pytest.importorskip("lmms_eval", reason="pip install --no-deps lmms-eval==0.7.3 "
                                "&& pip install -e '.[lmms]' (see README)")
ROOT = pathlib.Path(__file__).resolve().parents[2]
TASK = pathlib.Path(__file__).resolve().parent / "lmms_task"
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


def test_lmms_eval_runs_videorouter(synth_bench, tmp_path):
    import pyarrow.parquet as pq
    n = pq.read_metadata(synth_bench["data"]).num_rows
    task = tmp_path / "task"
    task.mkdir()
    for f in TASK.iterdir():
        if f.suffix in (".yaml", ".py"):
            (task / f.name).write_text(f.read_text().replace("__PARQUET__", synth_bench["data"])
                                       .replace("__VIDEOS__", synth_bench["videos"]))
    ep = _entry_point_dir(tmp_path)
    path = [str(ROOT)] + ([str(ep)] if ep else []) + [os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               HF_HOME=str(tmp_path / "hf"), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join(path))
    env.pop("TRITON_INTERPRET", None)
    log = tmp_path / "visual_tokens.jsonl"
    cmd = [sys.executable, "-m", "lmms_eval", "--model", "videorouter", "--model_args",
           f"pretrained=tiny,policy=auto,max_length=1400,num_frames=6,device=cpu,"
           f"visual_tokens_log={log}", "--tasks", "videorouter_synthetic", "--include_path",
           str(task), "--batch_size", "1", "--output_path", str(tmp_path / "out")]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert "videorouter_synthetic" in p.stdout and "accuracy" in p.stdout
    recs = [json.loads(x) for x in log.read_text().splitlines()]
    assert sorted(r["doc_id"] for r in recs) == list(range(n))
    for r in recs:
        assert r["policy"] in ("global", "fragment") and r["frames"] == 6
        assert 0 < r["visual_tokens"] <= r["budget"] < r["dense_visual_tokens"]
    assert (p.stdout + p.stderr).count("videorouter sample videorouter_synthetic/") == n
    results = list((tmp_path / "out").rglob("*results.json"))
    assert results, "lmms-eval wrote no results file"
    acc = json.loads(results[0].read_text())["results"]["videorouter_synthetic"]
    assert 0.0 <= acc["accuracy,none"] <= 1.0
