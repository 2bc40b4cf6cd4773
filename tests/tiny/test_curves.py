"""The training curves: Stage 3's panel chains Stage 3, 3b, 3c and 3d on one step axis, and a
run that began at 3c or 3d (``--from-v2``, ``--from-v3``) draws what it ran."""
import json

import matplotlib

matplotlib.use("Agg")

from vr_tiny.curves import _stage3_segments, plot_curves  # noqa: E402


def _log(folder, n, start_loss):
    folder.mkdir(parents=True)
    rows = [{"step": 10 * (i + 1), "loss": start_loss / (i + 1), "l_lm": start_loss / (i + 1)}
            for i in range(n)]
    (folder / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _lines(runs):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    drawn = _stage3_segments(ax, str(runs), ("loss", "l_lm"))
    lines = {ln.get_label(): list(ln.get_xdata()) for ln in ax.get_lines() if
             not ln.get_label().startswith("_")}
    plt.close(fig)
    return drawn, lines


def test_stage3_continuations_follow_each_other(tmp_path):
    _log(tmp_path / "stage3", 3, 4.0)
    _log(tmp_path / "stage3b", 2, 1.0)
    _log(tmp_path / "stage3c", 2, 0.5)
    _log(tmp_path / "stage3d", 1, 0.2)
    drawn, lines = _lines(tmp_path)
    assert len(drawn) == 8
    assert lines["loss"] == [10, 20, 30]
    assert lines["loss (3b)"] == [40, 50] and lines["loss (3c)"] == [60, 70]
    assert lines["loss (3d)"] == [80]


def test_a_run_from_v2_draws_stage3c_alone(tmp_path):
    _log(tmp_path / "stage3c", 3, 0.5)
    drawn, lines = _lines(tmp_path)
    assert len(drawn) == 3 and set(lines) == {"loss (3c)", "l_lm (3c)"}
    assert lines["loss (3c)"] == [10, 20, 30]
    out = plot_curves(str(tmp_path), str(tmp_path / "c.png"))
    assert (tmp_path / "c.png").stat().st_size > 0 and out.endswith("c.png")


def test_a_run_from_v3_draws_stage3d_alone(tmp_path):
    _log(tmp_path / "stage3d", 2, 0.5)
    drawn, lines = _lines(tmp_path)
    assert len(drawn) == 2 and set(lines) == {"loss (3d)", "l_lm (3d)"}


def test_a_v5_run_from_v3_draws_stage3e_then_3f(tmp_path):
    _log(tmp_path / "stage3e", 2, 0.5)
    _log(tmp_path / "stage3f", 2, 0.3)
    drawn, lines = _lines(tmp_path)
    assert len(drawn) == 4 and lines["loss (3e)"] == [10, 20] and lines["loss (3f)"] == [30, 40]


def test_a_v6_run_from_v5_draws_stage3g_alone(tmp_path):
    _log(tmp_path / "stage3g", 3, 0.4)
    drawn, lines = _lines(tmp_path)
    assert len(drawn) == 3 and lines["loss (3g)"] == [10, 20, 30]
