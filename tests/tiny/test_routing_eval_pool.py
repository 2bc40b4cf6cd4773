"""routing-eval --router-pool (issue 21 item 1): the pool reaches the Image Router of every
answer the evaluation makes, and the metrics name it."""
import pytest

from vr_tiny import routing_eval


def test_router_pool_reaches_every_image_router_call(tmp_path, monkeypatch):
    from vr_runtime.runtime import VideoRouter
    from vr_runtime.data.synthetic_videos import write_dataset
    paths = write_dataset(str(tmp_path), 1, seed=6, split="heldout")
    vr = VideoRouter.from_pretrained("tiny")
    seen = []
    orig = vr.routers.visual_cache

    def cache(Z, frame_batch=None, router_pool=None, grid=(16, 16)):
        seen.append(router_pool)
        return orig(Z, frame_batch, router_pool, grid)
    monkeypatch.setattr(vr.routers, "visual_cache", cache)
    m = routing_eval.eval_routing(vr, paths["conversations"], limit_videos=1, answers=False,
                                  router_pool=4)
    assert m["router_pool"] == 4 and seen and set(seen) == {4}
    seen.clear()
    m = routing_eval.eval_routing(vr, paths["conversations"], limit_videos=1, answers=False)
    pool = vr.routers.config.router_pool   # the shipped routers were trained at 2
    assert m["router_pool"] == pool == 2 and set(seen) == {pool}


def test_cli_refuses_a_bad_pool(tmp_path, capsys):
    from vr_tiny.__main__ import main
    f = tmp_path / "d.jsonl"
    f.write_text("")
    assert main(["routing-eval", "--data", str(f), "--router-pool", "0",
                 "--out", str(tmp_path / "o.json")]) == 2
    assert "--router-pool" in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()
