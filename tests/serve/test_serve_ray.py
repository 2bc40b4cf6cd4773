"""The Ray Serve deployment (vr_runtime/serve/ray_app.py) on a local Ray instance with 2 CPU
replicas: requests spread over both, and each answer equals the single-process server's."""
import concurrent.futures as cf
import os
import socket

import pytest

pytest.importorskip("fastapi")
serve = pytest.importorskip("ray.serve")
httpx = pytest.importorskip("httpx")

from bench.scripts import bench_serve  # noqa: E402
from serve_helpers import ROOT, stable, video_body  # noqa: E402

QUESTIONS = ["What shape is the red object?", "What color is the background?"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_url(tmp_path_factory):
    import ray
    media = bench_serve.make_media_dir(tmp_path_factory.mktemp("ray"))
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TRITON_INTERPRET": "1"}
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             runtime_env={"env_vars": env})
    try:
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        from vr_runtime.serve.ray_app import build_deployment
        app = build_deployment({"media_dir": str(media), "frames": 8, "max_length": 1400,
                                "max_new_tokens": 16}, num_replicas=2, num_gpus=0)
        serve.run(app, name="videorouter", route_prefix="/")
        yield f"http://127.0.0.1:{port}", media
    finally:
        serve.shutdown()
        ray.shutdown()


def test_two_replicas_spread_and_match_the_single_process_server(ray_url):
    from fastapi.testclient import TestClient

    from vr_runtime.serve.app import create_app
    from vr_runtime.serve.engine import Engine, EngineConfig
    from vr_runtime.serve.media import MediaConfig, MediaStore
    from vr_runtime.serve.schema import Limits
    url, media = ray_url
    bodies = [video_body((media / "sample.mp4").as_uri(), q, policy=p)
              for q in QUESTIONS for p in ("auto", "global")]
    with cf.ThreadPoolExecutor(8) as ex:
        got = list(ex.map(lambda b: httpx.post(f"{url}/v1/chat/completions", json=b,
                                               timeout=120), bodies * 4))
    assert all(r.status_code == 200 for r in got), [r.text for r in got if r.status_code != 200]
    workers = {r.headers["x-videorouter-worker"] for r in got}
    assert len(workers) == 2, workers
    assert os.getpid() not in {int(w.rsplit(":", 1)[1]) for w in workers}

    # The single-process server with the same settings.
    engine = Engine.load(EngineConfig(device="cpu"), MediaStore(MediaConfig(media_dir=media)))
    single = create_app(engine, limits=Limits(num_frames=8, max_length=1400, max_new_tokens=16))
    with TestClient(single) as c:
        want = [c.post("/v1/chat/completions", json=b).json() for b in bodies]
    for i, r in enumerate(got):
        w, g = want[i % len(bodies)], r.json()
        assert g["choices"] == w["choices"] and g["usage"] == w["usage"]
        assert stable(g["videorouter"]) == stable(w["videorouter"])
    bad = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                     json=video_body("file:///etc/passwd", QUESTIONS[0]))
    assert bad.status_code == 403 and bad.json()["error"]["code"] == 403
