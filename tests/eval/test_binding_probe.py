"""scripts/studies/binding_probe_tiny.py: the attention mass on a set of frames is the sum over
their visual rows, per head; the probe runs end to end on the shipped tiny weights and reports
both plans, both rows and both targets for every layer."""
import importlib.util
import json
import pathlib

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location(
    "binding_probe", ROOT / "scripts" / "studies" / "binding_probe_tiny.py")
bp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bp)


def test_frame_mass_sums_each_frames_own_rows():
    g = torch.Generator().manual_seed(7)
    att = torch.rand(3, 9, 40, generator=g)
    dest, counts = [5, 0, 21, 26], [16, 0, 4, 1]          # frame 1 dropped
    want = att[:, 8, 5:21].sum(-1) + att[:, 8, 26]
    torch.testing.assert_close(bp.frame_mass(att, 8, [0, 3], dest, counts), want)
    torch.testing.assert_close(bp.frame_mass(att, 8, [1], dest, counts), torch.zeros(3))


def test_probe_reports_every_plan_row_target_and_layer(tmp_path, monkeypatch):
    from vr_runtime.data import synthetic_videos as sv
    # 4 frames (one per target, one distractor, one empty) keep the eager attention small
    monkeypatch.setattr(bp, "_spec", lambda rng, task: sv.sample_spec(
        rng, num_frames=4, n_target=(1, 1), n_distractor=(1, 1)))
    out = tmp_path / "probe.json"
    bp.main(["--models", "tiny", "--videos", "1", "--out", str(out)])
    res = json.loads(out.read_text())
    assert res["videos"] == 1 and "command" in res
    r = res["models"]["tiny"]
    assert set(r) == {"dense", "fragment"}
    for plan in r.values():
        assert sum(v["questions"] for v in plan.values()) == 2      # both targets asked
        for v in plan.values():
            for who in ("answer_row", "color_word"):
                own, other = v[f"{who}_on_own_target"], v[f"{who}_on_other_target"]
                assert len(own) == 4
                for layer in own:
                    assert all(0 <= a and 0 <= b and a + b <= 1 + 1e-3
                               for a, b in zip(own[layer], other[layer]))


def test_probe_rejects_a_missing_model(tmp_path):
    with pytest.raises(SystemExit, match="not a directory"):
        bp.main(["--models", str(tmp_path / "nope"), "--out", str(tmp_path / "o.json")])
