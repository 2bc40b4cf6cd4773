"""The same server on Ray Serve: one replica per GPU, autoscaled, behind Ray's HTTP proxy.

Each replica is a process with one model -- exactly ``videorouter serve`` (the same FastAPI app,
engine, queue and limits) -- and Ray's router spreads requests over the replicas. On a cluster::

    pip install 'videorouter[serve,ray]'         # on every node, with the model files at PATH
    ray start --head                             # then `ray start --address=HEAD:6379` on the others
    serve run vr_runtime.serve.ray_app:app_builder model=PATH routers=R.safetensors \\
        media_dir=/shared/videos max_replicas=8

Arguments are ``videorouter serve``'s long options with ``_`` for ``-`` (``media_dir``,
``max_queue``, ``api_key``...) plus the Ray ones: ``num_gpus`` per replica (default 1 when the
cluster has GPUs, else 0), ``num_cpus`` per replica (default 1), and either ``num_replicas``
(fixed) or autoscaling between ``min_replicas`` (default 1) and ``max_replicas`` (default: the
cluster's GPU count, else 1) on ``target_ongoing_requests`` per replica (default 2). Ray's proxy
listens on its own host/port (``serve start --http-host 127.0.0.1 --http-port 8000``, loopback by
default as the single server is).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional

from .command import check_args, configs, serve_parser

RAY_KEYS = ("num_gpus", "num_cpus", "num_replicas", "min_replicas", "max_replicas",
            "target_ongoing_requests")


def serve_args(options: Dict[str, object]):
    """``videorouter serve``'s parsed arguments from ``{"media_dir": "/v", "max_queue": 8, ...}``
    (the same parser and checks as the command line)."""
    argv = ["serve"]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value not in (False, None):
            argv += [flag, str(value)]
    return serve_parser().parse_args(argv)


def build_deployment(options: Dict[str, object], num_gpus: Optional[float] = None,
                     num_cpus: float = 1, num_replicas: Optional[int] = None,
                     min_replicas: int = 1, max_replicas: Optional[int] = None,
                     target_ongoing_requests: float = 2):
    """The bound Ray Serve application (pass it to ``serve.run``)."""
    import ray
    from ray import serve

    from .app import create_app   # FastAPI: the serve extra
    from .engine import shared_engine

    args = serve_args(options)
    check_args(args)
    engine_cfg, media_cfg, _, app_kw = configs(args)
    gpus_in_cluster = int(ray.cluster_resources().get("GPU", 0)) if ray.is_initialized() else 0
    if num_gpus is None:
        num_gpus = 1 if gpus_in_cluster else 0
    if engine_cfg.device is None and num_gpus == 0:
        engine_cfg = dataclasses.replace(engine_cfg, device="cpu")
    scaling = {}
    if num_replicas is not None:
        scaling["num_replicas"] = int(num_replicas)
    else:
        scaling["autoscaling_config"] = {
            "min_replicas": int(min_replicas),
            "max_replicas": int(max_replicas or max(gpus_in_cluster, 1)),
            "target_ongoing_requests": float(target_ongoing_requests)}

    # The app reaches the replica's engine through shared_engine: the replica's constructor
    # loads it (so a replica is ready when Ray routes to it), the app finds the same one.
    app = create_app(lambda: shared_engine(engine_cfg, media_cfg), **app_kw)

    @serve.deployment(name="videorouter", ray_actor_options={"num_gpus": num_gpus,
                                                              "num_cpus": num_cpus},
                      # a replica takes what its own bounded queue holds; its 429 still applies
                      max_ongoing_requests=engine_cfg.max_queue + 1, **scaling)
    @serve.ingress(app)
    class VideoRouterReplica:
        def __init__(self):
            shared_engine(engine_cfg, media_cfg)

    return VideoRouterReplica.bind()


def app_builder(args: Dict[str, str]):
    """For ``serve run vr_runtime.serve.ray_app:app_builder key=value ...``."""
    args = dict(args)
    ray_kw = {}
    for key in RAY_KEYS:
        if key in args:
            v = args.pop(key)
            ray_kw[key] = float(v) if key in ("num_gpus", "num_cpus",
                                              "target_ongoing_requests") else int(v)
    flags = {k: (True if k == "allow_remote_media" and str(v).lower() in ("1", "true", "yes")
                 else v) for k, v in args.items()}
    return build_deployment(flags, **ray_kw)
