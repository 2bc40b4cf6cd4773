"""``videorouter serve``: its arguments and its start-up (SPEC section 6).

    videorouter serve [--model PATH|tiny] [--routers PATH] [--host 127.0.0.1] [--port 8000]
                      --media-dir DIR [--api-key KEY] [--max-queue 64] [...limits, see --help]

Start-up checks everything it can before the model loads -- the media directory, the numbers,
that the address can be bound -- and fails with one line and status 2, as ``ask`` does. The
address is bound before the model loads, so a busy port fails in a moment. This module imports
only the standard library until ``run_serve`` runs: building the ``videorouter`` parser stays
fast.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import socket
import sys

API_KEY_ENV = "VIDEOROUTER_API_KEY"


def add_serve_parser(sub, positive_int, policy_help: str, dtypes) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "serve", help="serve an OpenAI-compatible video QA API (POST /v1/chat/completions)",
        description="Serve VideoRouter over HTTP: POST /v1/chat/completions (text + a video_url "
        "part), GET /v1/models, GET /health. Binds to 127.0.0.1 unless --host says otherwise.")
    p.add_argument("--model", default="tiny", metavar="PATH|tiny",
                   help="as for ask (default: tiny)")
    p.add_argument("--routers", default=None, metavar="PATH", help="as for ask")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="default: cuda if available, else cpu")
    p.add_argument("--dtype", choices=dtypes, default=None,
                   help="default: bf16 on cuda, fp32 on cpu")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=_port, default=8000,
                   help="port (default: 8000; 0 picks a free one and prints it)")
    p.add_argument("--media-dir", required=True, metavar="DIR",
                   help="file:// video URLs must resolve (after .. and symlinks) inside DIR")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help=f"require 'Authorization: Bearer KEY' on /v1 (or set {API_KEY_ENV})")
    p.add_argument("--served-model-name", default=None, metavar="NAME",
                   help="the model id in /v1/models and responses (default: --model)")
    p.add_argument("--max-queue", type=_non_negative_int, default=64,
                   help="requests that may wait behind the running one; more get 429 "
                        "(default: 64)")
    p.add_argument("--timeout", type=_positive_float, default=300.0, metavar="SECONDS",
                   help="per-request time limit, from arrival to answer; 504 after it "
                        "(default: 300)")
    p.add_argument("--max-body-mb", type=_positive_float, default=100.0,
                   help="largest request body (default: 100)")
    p.add_argument("--max-video-mb", type=_positive_float, default=64.0,
                   help="largest data: (or downloaded) video (default: 64)")
    p.add_argument("--max-video-seconds", type=_positive_float, default=4 * 3600.0,
                   help="longest video accepted (default: 14400)")
    p.add_argument("--max-frames", type=positive_int("--max-frames"), default=256,
                   help="largest num_frames a request may ask for (default: 256)")
    p.add_argument("--max-tokens", type=positive_int("--max-tokens"), default=4096,
                   help="largest max_tokens a request may ask for (default: 4096)")
    p.add_argument("--frames", type=positive_int("--frames"), default=64,
                   help="num_frames of a request that gives none (default: 64, as ask)")
    p.add_argument("--max-length", type=positive_int("--max-length"), default=12288,
                   help="max_length of a request that gives none (default: 12288, as ask)")
    p.add_argument("--max-new-tokens", type=positive_int("--max-new-tokens"), default=64,
                   help="max_tokens of a request that gives none (default: 64, as ask)")
    p.add_argument("--policy", default="auto", metavar=policy_help,
                   help="policy of a request that gives none (default: auto, as ask)")
    p.add_argument("--visual-cache", type=_non_negative_int, default=4, metavar="N",
                   help="videos whose decoded frames, Z and Image Router state are kept for "
                        "the next request on them (default: 4; 0 turns reuse off)")
    p.add_argument("--allow-remote-media", action="store_true",
                   help="also accept http(s):// video URLs (downloaded under --max-video-mb)")
    p.add_argument("--log-level", choices=("error", "warning", "info", "debug"),
                   default="warning", help="server log level (default: warning)")
    return p


def _arg_types():
    from ..cli import arg_type  # standard library only
    inf = float("inf")
    return (arg_type(int, lambda v: 0 <= v <= 65535, "a port number 0-65535"),
            arg_type(int, lambda v: v >= 0, "an integer >= 0"),
            arg_type(float, lambda v: 0 < v < inf, "a number > 0"))


_port, _non_negative_int, _positive_float = _arg_types()


def configs(args):
    """(EngineConfig, MediaConfig, Limits, app kwargs) from the parsed arguments; also used by
    the Ray Serve builder, so both servers read settings the same way."""
    from .engine import EngineConfig
    from .media import MediaConfig
    from .schema import Limits
    engine = EngineConfig(model=args.model, routers=args.routers, device=args.device,
                          dtype=args.dtype, visual_cache=args.visual_cache,
                          max_queue=args.max_queue, timeout_s=args.timeout)
    media = MediaConfig(media_dir=pathlib.Path(args.media_dir),
                        max_video_bytes=int(args.max_video_mb * 2**20),
                        max_video_seconds=args.max_video_seconds,
                        allow_remote=bool(args.allow_remote_media))
    limits = Limits(num_frames=args.frames, max_length=args.max_length,
                    max_new_tokens=args.max_new_tokens, policy=args.policy,
                    max_frames=args.max_frames, max_new_tokens_limit=args.max_tokens)
    app_kw = dict(limits=limits, api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
                  max_body_bytes=int(args.max_body_mb * 2**20),
                  served_model_name=args.served_model_name)
    return engine, media, limits, app_kw


def check_args(args) -> None:
    """What can be checked before anything heavy: raises a user error (ValueError)."""
    from ..cli import UsageError, _check_inputs
    d = pathlib.Path(args.media_dir)
    if not d.is_dir():
        raise UsageError(f"--media-dir {args.media_dir!r}: no such directory")
    if args.frames > args.max_frames:
        raise UsageError(f"--frames {args.frames} is over --max-frames {args.max_frames}")
    if args.max_new_tokens > args.max_tokens:
        raise UsageError(f"--max-new-tokens {args.max_new_tokens} is over --max-tokens "
                         f"{args.max_tokens}")
    # ask's own checks of --policy, --model and --routers (same messages).
    _check_inputs(argparse.Namespace(question="serve", plot=None, policy=args.policy,
                                     model=args.model, routers=args.routers))
    import importlib.util
    missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"videorouter serve needs FastAPI and uvicorn ({', '.join(missing)} "
                         f"missing): pip install 'videorouter[serve]'")


def bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise OSError(f"--host {host!r}: cannot resolve the address ({e.strerror})") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port} ({e.strerror}); pick another --port") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def run_serve(args) -> int:
    from ..cli import fail_with
    debug = os.environ.get("VIDEOROUTER_DEBUG", "") not in ("", "0")
    try:
        check_args(args)
        engine_cfg, media_cfg, _, app_kw = configs(args)
        sock = bind(args.host, args.port)
        from .app import create_app
        from .engine import Engine
        from .media import MediaStore
        media = MediaStore(media_cfg)
        engine = Engine.load(engine_cfg, media)
        app = create_app(engine, **app_kw)
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001 - start-up errors become one line, as in ask
        fail_with(e, debug)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    note = "" if app_kw["api_key"] else " (no API key)"
    if args.host not in ("127.0.0.1", "localhost", "::1") and not app_kw["api_key"]:
        note = " -- WARNING: reachable from other machines without an API key"
    sys.stderr.write(f"videorouter serve: http://{shown}:{port}/v1 model {engine.name!r}, media "
                     f"dir {str(media.root)!r}{note}\n")
    sys.stderr.flush()
    import logging

    import uvicorn
    logging.getLogger("videorouter.serve").setLevel(args.log_level.upper())
    config = uvicorn.Config(app, log_level=args.log_level, access_log=args.log_level == "debug",
                            lifespan="off", timeout_graceful_shutdown=5)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        engine.close()
        media.close()
    return 0
