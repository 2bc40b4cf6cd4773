"""Models named by their Hugging Face Hub id (issue 24): resolved from the local Hugging Face
cache, never downloaded; one line with the download command when the id is not cached. The
cache here is a fake one built in the test, in the layout huggingface_hub writes
(``models--org--name/refs/main`` + ``snapshots/<commit>/``), holding the tiny model's files."""
import json
import os
import subprocess
import sys

import pytest
import torch

from vr_runtime import cli
from vr_runtime.backbones import frame_spec_for, load_backbone, resolve_model
from vr_runtime.errors import ModelFilesError

REPO = "TinyOrg/tiny-internvl-hf"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf") / "hub"
    repo = root / ("models--" + REPO.replace("/", "--"))
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    lm = load_backbone("tiny")
    lm.model.save_pretrained(snap, safe_serialization=True)
    lm.tokenizer.save_pretrained(snap)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return root, snap


@pytest.fixture
def use_cache(hub_cache, monkeypatch):
    """Point huggingface_hub at the fake cache (its constants are read at import time)."""
    import huggingface_hub.constants as hc
    root, snap = hub_cache
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    return snap


def test_hub_id_resolves_to_the_cached_snapshot(use_cache):
    assert resolve_model(REPO) == use_cache
    assert resolve_model("tiny") == "tiny"                  # presets pass through
    assert resolve_model(str(use_cache)) == use_cache       # so do local directories
    lm, ref = load_backbone(REPO), load_backbone("tiny")
    a, b = ref.model.state_dict(), lm.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert frame_spec_for(REPO) == frame_spec_for("tiny")
    from vr_runtime import VideoRouter
    vr = VideoRouter.from_pretrained(REPO)                   # the Python API, same resolver
    assert vr.lm.image_token_id == ref.image_token_id


def test_uncached_hub_id_gives_the_download_command(use_cache):
    with pytest.raises(ModelFilesError) as e:
        resolve_model("TinyOrg/not-downloaded")
    msg = str(e.value)
    assert "\n" not in msg and "hf download TinyOrg/not-downloaded" in msg
    assert "Hugging Face cache" in msg
    with pytest.raises(ModelFilesError, match="not a directory"):   # a path, not an id
        resolve_model(str(use_cache.parent / "absent"))


def _usage_error(capsys, argv):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_ask_serve_eval_name_the_download_command(use_cache, tmp_path, capsys):
    missing = "TinyOrg/not-downloaded"
    err = _usage_error(capsys, ["ask", str(cli.SAMPLE_VIDEO), "What?", "--model", missing])
    assert err.startswith(f"videorouter: error: --model '{missing}': ")
    assert f"hf download {missing}" in err
    err = _usage_error(capsys, ["serve", "--media-dir", str(tmp_path), "--model", missing])
    assert f"--model '{missing}'" in err and f"hf download {missing}" in err
    err = _usage_error(capsys, ["eval", "--benchmark", "videomme", "--data", str(tmp_path),
                                "--videos", str(tmp_path), "--model", missing])
    assert f"--model '{missing}'" in err and f"hf download {missing}" in err


def test_ask_answers_with_a_cached_hub_id(hub_cache):
    """End to end as a user runs it: a fresh process with HF_HUB_CACHE set."""
    root, _ = hub_cache
    env = dict(os.environ, HF_HUB_CACHE=str(root), HF_HUB_OFFLINE="1")
    env.pop("VIDEOROUTER_DEBUG", None)
    p = subprocess.run([sys.executable, "-m", "vr_runtime.cli", "ask", str(cli.SAMPLE_VIDEO),
                        "Which shape is blue?", "--model", REPO, "--frames", "4", "--json"],
                       capture_output=True, text=True, timeout=180, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["text"] and out["report"]["visual_tokens"] > 0
    assert out["report"]["model"] == REPO          # the id, not the snapshot's commit hash
