"""Stage 0 (tiny-only pretraining): captions, token alignment, and a short run end to end."""
import random

import pytest
import torch

from vr_kernels.reference import pool_frame  # the plain reference of a window's mean
from vr_tiny import pretrain as s0
from vr_runtime.data.synthetic_videos import COLORS, SHAPES


def test_color_caption_names_every_color_once_with_its_shape():
    cfg = s0.PretrainConfig(two_shape_prob=0.5)
    rng = random.Random(0)
    for _ in range(200):
        spec = s0.random_frame_spec(rng, cfg)
        pairs = s0.caption(spec, rng, "color")
        assert sorted(c for c, _ in pairs) == sorted(COLORS)
        shape_of = {s.color: s.shape for s in spec.shapes}
        assert len(shape_of) == len(spec.shapes) <= 2          # two shapes: two colors
        for c, a in pairs:
            assert a == shape_of.get(c, "no") and (a == "no" or a in SHAPES)


def test_shape_caption_names_every_shape_once_with_its_color():
    cfg = s0.PretrainConfig(two_shape_prob=0.5, shape_query_prob=0.5)
    rng = random.Random(2)
    seen = set()
    for _ in range(200):
        spec = s0.random_frame_spec(rng, cfg)
        pairs = s0.caption(spec, rng, "shape")
        assert sorted(q for q, _ in pairs) == sorted(SHAPES)
        color_of = {s.shape: s.color for s in spec.shapes}
        assert len(color_of) == len(spec.shapes)  # with shape queries, two shapes: two outlines
        for q, a in pairs:
            assert a == color_of.get(q, "no") and (a == "no" or a in COLORS)
        seen.add(tuple(q for q, _ in pairs))
    assert len(seen) > 1                                       # the order is random
    with pytest.raises(ValueError, match="caption mode"):
        s0.caption(spec, rng, "size")


def test_shape_answers_get_their_weight():
    from vr_runtime.backbones.tiny import load_tiny_tokenizer
    toks = s0.CaptionTokens(load_tiny_tokenizer())
    tgt = torch.tensor([[toks.ids["circle"], -100, toks.ids["no"], -100, toks.ids["red"]]])
    w = s0.shape_answer_weight(tgt, toks, 3.0)
    assert w.tolist() == [[3.0, 1.0, 1.0, 1.0, 1.0]]


def test_two_shapes_do_not_overlap():
    cfg = s0.PretrainConfig(two_shape_prob=1.0, empty_prob=0.0)
    rng = random.Random(1)
    for _ in range(100):
        spec = s0.random_frame_spec(rng, cfg)
        a, b = spec.shapes
        assert abs(a.cx - b.cx) > a.r + b.r  # side by side, disjoint bounding boxes


def test_targets_follow_each_color_word():
    from vr_runtime.backbones.tiny import load_tiny_tokenizer
    toks = s0.CaptionTokens(load_tiny_tokenizer())
    pairs = [("red", "circle"), ("blue", "no")]
    ids, tgt = toks.encode(pairs)
    assert ids == [toks.ids["red"], toks.ids["circle"], toks.ids["blue"], toks.ids["no"]]
    # the color word's position predicts the answer; the answer's position has no loss
    assert tgt == [toks.ids["circle"], -100, toks.ids["no"], -100]


def test_config_rejects_unknown_fields():
    with pytest.raises(ValueError, match="unknown keys"):
        s0.PretrainConfig.load("tiny_stage0", not_a_field=1)


def _short_run(tmp_path, **kw):
    from vr_runtime.backbones import load_backbone
    from vr_runtime.backbones.internvl3 import InternVL3Backbone
    from vr_runtime.backbones.tiny import init_weights_
    kw = {"projector_steps": 4, **kw}
    cfg = s0.PretrainConfig.load("tiny_stage0", frames=24, heldout_frames=6, steps=3,
                                 batch_size=4, warmup_steps=1, output_dir=str(tmp_path / "s0"),
                                 **kw)
    res = s0.pretrain(cfg, progress=False)
    windows = {"window_1", "window_2", "window_4"}
    assert set(res["metrics"]) == windows | ({"projector_readout"} if cfg.projector_steps else set())
    for m in (res["metrics"][w] for w in windows):
        for k in ("presence_accuracy", "shape_accuracy", "locate_accuracy"):
            assert 0.0 <= m[k] <= 1.0
        assert m["queries"] == 6 * (6 + 3)          # both caption modes on every held-out frame
    trained = load_backbone(str(tmp_path / "s0" / "hf"), dtype=torch.float32)
    fill = InternVL3Backbone.tiny(dtype=torch.float32)
    init_weights_(fill.model, 0)
    a, b = dict(trained.model.named_parameters()), dict(fill.model.named_parameters())
    vision = {n for n, _ in fill.model.named_parameters() if n.startswith("model.vision_tower")}
    assert vision, "vision tower parameters not found"
    moved = {n for n in a if not torch.equal(a[n], b[n])}
    assert any("multi_modal_projector" in n for n in moved)
    assert any("language_model" in n for n in moved)
    return res, vision, moved


def test_short_run_keeps_the_tower_at_its_fill(tmp_path):
    res, vision, moved = _short_run(tmp_path)            # the shipped config: tower frozen
    assert res["trainable"] == ["projector", "language"]
    assert not vision & moved


def test_train_vision_option_moves_the_tower(tmp_path):
    res, vision, moved = _short_run(tmp_path, train_vision=True, vision_learning_rate=1e-3,
                                    shape_query_prob=0.5, projector_steps=0)
    assert res["trainable"] == ["vision", "projector", "language"]
    assert vision & moved


def test_default_frames_keep_the_shipped_random_sequence():
    # shape queries off: two-shape frames may repeat a shape, as in the shipped run's data
    rng = random.Random(5)
    cfg = s0.PretrainConfig(two_shape_prob=1.0, empty_prob=0.0)
    specs = [s0.random_frame_spec(rng, cfg) for _ in range(200)]
    assert any(a.shape == b.shape for a, b in (sp.shapes for sp in specs))


def test_projector_phase_needs_the_frame_bank(tmp_path):
    cfg = s0.PretrainConfig(frames=8, heldout_frames=2, steps=1, batch_size=2, projector_steps=2,
                            train_vision=True, output_dir=str(tmp_path / "s0"))
    with pytest.raises(ValueError, match="projector_steps needs the frame bank"):
        s0.pretrain(cfg, progress=False)


def test_projector_is_trained_in_phase_a_and_frozen_in_phase_b(tmp_path, monkeypatch):
    from vr_runtime.backbones import load_backbone
    seen = {}
    phase_a = s0.pretrain_projector

    def spy(bb, *a, **k):
        out = phase_a(bb, *a, **k)
        seen.update({n: p.detach().clone() for n, p in bb.projector().named_parameters()})
        return out

    monkeypatch.setattr(s0, "pretrain_projector", spy)
    res, _, moved = _short_run(tmp_path, projector_steps=6)
    assert res["projector_frozen_in_captions"] is True
    for w, m in res["metrics"]["projector_readout"].items():
        assert 0.0 <= m["color_accuracy"] <= 1.0 and 0.0 <= m["shape_accuracy"] <= 1.0
    trained = load_backbone(str(tmp_path / "s0" / "hf"), dtype=torch.float32)
    after = dict(trained.projector().named_parameters())
    assert seen and all(torch.equal(after[n], p) for n, p in seen.items())   # phase B: frozen


def _reference_coverage(spec, grid):
    """Per-cell fraction of the rendered frame's pixels that show the (only) object's color."""
    import numpy as np
    from vr_runtime.data.synthetic_videos import COLORS, render_frame
    img = render_frame(spec, 0).astype(int)
    gh, gw = grid
    ch, cw = spec.size // gh, spec.size // gw
    hit = (img == np.array(COLORS[spec.shapes[0].color])).all(-1)
    out = np.zeros((gh, gw))
    for i in range(gh):
        for j in range(gw):
            out[i, j] = hit[i * ch:(i + 1) * ch, j * cw:(j + 1) * cw].mean()
    return out.reshape(-1)


@pytest.mark.parametrize("grid", [(16, 16), (7, 5)])
def test_object_coverage_matches_the_rendered_pixels(grid):
    from vr_runtime.data.synthetic_videos import Shape, VideoSpec
    rng = random.Random(3)
    for shape in SHAPES:
        for _ in range(3):
            size = 448 if grid == (16, 16) else 210
            r = rng.randint(size // 12, size // 4)
            spec = VideoSpec(num_frames=1, size=size, background="gray")
            spec.shapes.append(Shape(0, shape, rng.choice(sorted(COLORS)),
                                     rng.randint(r + 4, size - r - 5),
                                     rng.randint(r + 4, size - r - 5), r))
            (cov, color, sh), = s0.object_coverage(spec, grid)
            assert cov.shape == (grid[0] * grid[1],)
            assert sorted(COLORS)[color] == spec.shapes[0].color and SHAPES[sh] == shape
            torch.testing.assert_close(cov.double(),
                                       torch.from_numpy(_reference_coverage(spec, grid)))


@pytest.mark.parametrize("window,grid", [(1, (16, 16)), (2, (16, 16)), (4, (16, 16)),
                                         (2, (5, 7)), (3, (5, 7))])
def test_object_readout_is_the_coverage_weighted_mean_of_pooled_tokens(window, grid):
    from vr_runtime.routing.routers import pool_frames
    torch.manual_seed(window)
    D, n = 12, grid[0] * grid[1]
    readout = s0.ObjectReadout(D)
    Z, objects = _random_objects(n, D)
    Zp = pool_frames(Z, window, grid) if window > 1 else Z
    logits, colors, shapes = readout(Zp, objects, window, grid)
    assert colors.tolist() == [1, 4, 0] and shapes.tolist() == [2, 0, 1]
    rows = []
    for f, objs in enumerate(objects):
        z = pool_frame(Z[f], (window, window), grid)
        for cov, _, _ in objs:
            c = pool_frame(cov[:, None], (window, window), grid)[:, 0]
            rows.append((z * c[:, None]).sum(0) / c.sum())
    torch.testing.assert_close(logits, readout.linear(torch.stack(rows)), atol=1e-5, rtol=1e-5)


def _random_objects(n, D):
    """Two frames' tokens [2, n, D] and random objects (three, two in the first frame)."""
    objects = [[(torch.rand(n) * (torch.rand(n) > 0.5), 1, 2), (torch.rand(n), 4, 0)],
               [(torch.rand(n), 0, 1)]]
    return torch.randn(2, n, D), objects


@pytest.mark.parametrize("window,grid", [(1, (16, 16)), (2, (16, 16)), (4, (16, 16)),
                                         (3, (5, 7))])
def test_cell_readout_reads_every_cell_an_object_covers_at_least_half(window, grid):
    from vr_runtime.routing.routers import pool_frames
    torch.manual_seed(10 + window)
    D, n = 12, grid[0] * grid[1]
    readout = s0.CellReadout(D)
    Z, objects = _random_objects(n, D)
    Zp = pool_frames(Z, window, grid) if window > 1 else Z
    logits, colors, shapes = readout(Zp, objects, window, grid)
    rows, want_c, want_s = [], [], []
    for f, objs in enumerate(objects):
        z = pool_frame(Z[f], (window, window), grid)
        for cov, color, shape in objs:
            c = pool_frame(cov[:, None], (window, window), grid)[:, 0]
            for cell in range(len(c)):
                if c[cell] >= 0.5:
                    rows.append(z[cell]), want_c.append(color), want_s.append(shape)
    assert colors.tolist() == want_c and shapes.tolist() == want_s and len(rows) > 3
    torch.testing.assert_close(logits, readout.linear(torch.stack(rows)), atol=1e-5, rtol=1e-5)


def test_cell_readout_falls_back_to_each_objects_fullest_cell():
    readout = s0.CellReadout(4)
    Z = torch.randn(1, 6, 4)
    cov = torch.tensor([0.0, 0.1, 0.4, 0.2, 0.0, 0.0])      # too small to cover half a cell
    logits, colors, shapes = readout(Z, [[(cov, 3, 1)]], 1, (2, 3))
    assert colors.tolist() == [3] and shapes.tolist() == [1]
    torch.testing.assert_close(logits, readout.linear(Z[0, 2:3]))


def test_tower_phase_trains_the_tower_and_the_projector(tmp_path):
    res, vision, moved = _short_run(tmp_path, tower_steps=2, tower_batch_size=2,
                                    projector_readout="cells")
    assert res["trainable"] == ["vision", "projector", "language"]
    assert vision & moved and res["tower_s"] >= 0
    assert res["config"]["projector_readout"] == "cells"


@pytest.mark.parametrize("kw,match", [
    ({"projector_readout": "mean"}, "projector_readout: expected one of coverage, cells"),
    ({"tower_steps": -1}, "tower_steps, tower_batch_size"),
    ({"tower_batch_size": 0}, "tower_steps, tower_batch_size"),
    ({"tower_steps": 2, "train_vision": True}, "does not combine with train_vision")])
def test_bad_tower_and_readout_settings_fail_in_one_line(kw, match):
    with pytest.raises(ValueError, match=match) as err:
        s0.PretrainConfig.load("tiny_stage0", **kw)
    assert "\n" not in str(err.value)


def test_binding_accuracy_counts_the_frames_whose_two_shapes_differ(monkeypatch):
    # a reader that answers every frame right except those with two different shapes, where it
    # says "no": binding 0, shape accuracy the share of the other frames' present answers
    from vr_runtime.backbones.tiny import load_tiny_tokenizer
    toks = s0.CaptionTokens(load_tiny_tokenizer())
    rng = random.Random(4)
    cfg = s0.PretrainConfig(two_shape_prob=0.6, empty_prob=0.1)
    specs = [s0.random_frame_spec(rng, cfg) for _ in range(40)]
    differ = [len({o.shape for o in sp.shapes}) == 2 for sp in specs]
    assert any(differ) and not all(differ)
    vocab = max(toks.ids.values()) + 1

    def fake_batch(bb, V, bspecs, window, toks_, rng_, mode="color"):
        ids, tgt = zip(*(toks_.encode(s0.caption(sp, rng_, mode)) for sp in bspecs))
        return V, torch.tensor(tgt)

    def fake_loss(bb, x, tgt, weight=None):
        pred = torch.where(tgt == -100, toks.ids["no"], tgt)
        pred[x[:, 0] > 0] = toks.ids["no"]
        return None, torch.nn.functional.one_hot(pred, vocab).float()

    monkeypatch.setattr(s0, "_batch", fake_batch)
    monkeypatch.setattr(s0, "_loss", fake_loss)

    class BB:
        model = torch.nn.Linear(1, 1)

    V = torch.tensor(differ, dtype=torch.float32)[:, None]
    m = s0.evaluate(BB(), V, specs, toks, (1,), batch=7)["window_1"]
    present = sum(len(sp.shapes) for sp in specs)
    assert m["binding_queries"] == 2 * sum(differ) and m["binding_accuracy"] == 0.0
    assert m["shape_accuracy"] == (present - 2 * sum(differ)) / present
