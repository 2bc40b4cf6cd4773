"""``videorouter serve``: its arguments and its start-up (docs/CONTRACT.md section 6).

    videorouter serve [--model PATH|HUB_ID|tiny] [--routers PATH] [--host 127.0.0.1] [--port 8000]
                      --media-dir DIR [--api-key KEY] [--max-queue 64] [...limits, see --help]

Start-up checks everything it can before the model loads -- the media directory, the numbers,
that the address can be bound -- and fails with one line and status 2, as ``ask`` does. The
address is bound before the model loads, so a busy port fails in a moment. This module imports
only the standard library until ``run_serve`` runs: building the ``videorouter`` parser stays
fast.
"""
from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import pathlib
import signal
import socket
import sys

from ..cli_args import (MAX_FRAME_PIXELS, Parser, add_answer_args, add_speed_args, arg_type,
                        model_help, positive_int)
from ..cli_io import PROG, UsageError, fail_with, stderr_is_tty
from ..planning.scales import SCALES_HELP

API_KEY_ENV = "VIDEOROUTER_API_KEY"


def serve_parser() -> argparse.ArgumentParser:
    """The ``videorouter`` parser with the ``serve`` subcommand alone:
    ``serve_parser().parse_args(["serve", ...])`` reads what ``videorouter serve ...`` does (the
    Ray Serve builder reads its options with it)."""
    parser = Parser(prog=PROG)
    sub = parser.add_subparsers(dest="command", metavar="{serve}", parser_class=Parser)
    sub.required = True
    add_serve_parser(sub)
    return parser


def add_serve_parser(sub) -> argparse.ArgumentParser:
    """Add ``serve`` to the subcommands ``sub`` (its flags come from vr_runtime.cli_args)."""
    p = sub.add_parser(
        "serve", help="serve an OpenAI-compatible video QA API (POST /v1/chat/completions)",
        description="Serve VideoRouter over HTTP: POST /v1/chat/completions (text + a video_url "
        "part), GET /v1/models, GET /health. Binds to 127.0.0.1 unless --host says otherwise.")
    p.add_argument("--model", default="tiny", metavar="PATH|HUB_ID|PRESET",
                   help=f"{model_help()} (default: tiny)")
    p.add_argument("--routers", default=None, metavar="PATH", help="as for ask")
    _add_server_args(p)
    _add_limit_args(p)
    add_answer_args(p, flags=SERVE_ANSWER_FLAGS, overrides=_serve_answer_overrides())
    add_speed_args(p)
    p.add_argument("--visual-cache", type=_non_negative_int, default=4, metavar="N",
                   help="videos whose decoded frames, Z and Image Router state are kept for "
                        "the next request on them (default: 4; 0 turns reuse off)")
    p.add_argument("--no-ui", action="store_true",
                   help="do not serve GET /ui, the page that asks a video and shows what the "
                        "router kept (vr_runtime.serve.ui; on by default)")
    p.add_argument("--allow-remote-media", action="store_true",
                   help="also accept http(s):// video URLs (downloaded under --max-video-mb)")
    p.add_argument("--log-level", choices=("error", "warning", "info", "debug"),
                   default="warning", help="server log level; info adds an access log line "
                   "per API request: method, path, status, latency, tokens (default: warning)")
    return p


# ask's answer flags that serve has: the defaults of a request that gives no value of its own.
SERVE_ANSWER_FLAGS = ("--frames", "--max-length", "--max-new-tokens", "--policy", "--scales",
                      "--scorer", "--max-frame-pixels", "--device", "--dtype")


def _serve_answer_overrides() -> dict:
    return {
        "--frames": dict(help="num_frames of a request that gives none (default: 64, as ask)"),
        "--max-length": dict(help="max_length of a request that gives none (default: 12288, as "
                                  "ask)"),
        "--max-new-tokens": dict(help="max_tokens of a request that gives none (default: 64, "
                                      "as ask)"),
        "--policy": dict(help="policy of a request that gives none (default: auto, as ask)"),
        "--scales": dict(default=(2, 1, 4),
                         help="scales of a request that gives none (its 'scales' field, or "
                              "mm_processor_kwargs.scales); " + SCALES_HELP),
        "--max-frame-pixels": dict(
            help="largest frame (width x height; a GIF's logical screen) a video may have, "
                 "checked before decoding (default: 33177600, 8K UHD)"),
    }


def _add_server_args(p) -> None:
    """Where to listen, who may ask, how requests queue and end."""
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
    p.add_argument("--max-batch", type=positive_int("--max-batch"), default=1, metavar="N",
                   help="answer up to N waiting requests with the same settings together "
                        "(VideoRouter.answer_batch: one prefill and decode, each answer as "
                        "alone; streaming requests are never batched; default: 1, one at a "
                        "time)")
    p.add_argument("--timeout", type=_positive_float, default=300.0, metavar="SECONDS",
                   help="per-request time limit, from arrival to answer; 504 after it "
                        "(default: 300)")
    p.add_argument("--drain-timeout", type=_positive_float, default=25.0, metavar="SECONDS",
                   help="on SIGTERM or Ctrl-C: time the running request gets to finish; every "
                        "queued one is answered 503 + Retry-After at once (default: 25)")


def _add_limit_args(p) -> None:
    """The caps on what a request may send or ask for."""
    p.add_argument("--max-body-mb", type=_positive_float, default=100.0,
                   help="largest request body (default: 100)")
    p.add_argument("--max-video-mb", type=_positive_float, default=64.0,
                   help="largest data: (or downloaded) video (default: 64)")
    p.add_argument("--max-video-seconds", type=_positive_float, default=4 * 3600.0,
                   help="longest video accepted, declared or counted while indexing "
                        "(default: 14400)")
    p.add_argument("--max-inflight-mb", type=_positive_float, default=512.0,
                   help="request bodies held in memory at once, all requests together; "
                        "more get 503 + Retry-After (default: 512)")
    p.add_argument("--max-frames", type=positive_int("--max-frames"), default=256,
                   help="largest num_frames a request may ask for (default: 256)")
    p.add_argument("--max-tokens", type=positive_int("--max-tokens"), default=4096,
                   help="largest max_tokens a request may ask for (default: 4096)")
    p.add_argument("--max-prompt-chars", type=positive_int("--max-prompt-chars"), default=None,
                   metavar="N", help="largest question + system text in characters, checked "
                   "before tokenizing; more is a 400 (default: 16 x --max-prompt-tokens)")
    p.add_argument("--max-prompt-tokens", type=positive_int("--max-prompt-tokens"),
                   default=None, metavar="N",
                   help="largest question + system text in tokens, counted off the model's "
                        "lock; more is a 400 (default: --max-length)")


_port = arg_type(int, lambda v: 0 <= v <= 65535, "a port number 0-65535")
_non_negative_int = arg_type(int, lambda v: v >= 0, "an integer >= 0")
_positive_float = arg_type(float, lambda v: 0 < v < float("inf"), "a number > 0")


def configs(args):
    """(EngineConfig, MediaConfig, Limits, app kwargs) from the parsed arguments; also used by
    the Ray Serve builder, so both servers read settings the same way."""
    from .engine import EngineConfig
    from .media import MediaConfig
    from .schema import Limits
    engine = EngineConfig(model=args.model, routers=args.routers, device=args.device,
                          dtype=args.dtype, visual_cache=args.visual_cache,
                          max_queue=args.max_queue, timeout_s=args.timeout,
                          max_batch=getattr(args, "max_batch", 1),
                          scorer=getattr(args, "scorer", "image-router"),
                          scorer_model=getattr(args, "scorer_model", None),
                          decoding=getattr(args, "decoding", "auto"),
                          vision_compile=getattr(args, "vision_compile", "auto"),
                          router_compile=getattr(args, "router_compile", "auto"),
                          compile_cache=getattr(args, "compile_cache", None))
    media = MediaConfig(media_dir=pathlib.Path(args.media_dir),
                        max_video_bytes=int(args.max_video_mb * 2**20),
                        max_video_seconds=args.max_video_seconds,
                        allow_remote=bool(args.allow_remote_media),
                        max_frame_pixels=getattr(args, "max_frame_pixels", MAX_FRAME_PIXELS))
    limits = Limits(num_frames=args.frames, max_length=args.max_length,
                    max_new_tokens=args.max_new_tokens, policy=args.policy,
                    scales=getattr(args, "scales", (2, 1, 4)), max_frames=args.max_frames,
                    max_new_tokens_limit=args.max_tokens,
                    max_prompt_chars=getattr(args, "max_prompt_chars", None),
                    max_prompt_tokens=getattr(args, "max_prompt_tokens", None))
    app_kw = dict(limits=limits, api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
                  max_body_bytes=int(args.max_body_mb * 2**20),
                  served_model_name=args.served_model_name,
                  max_inflight_bytes=int(getattr(args, "max_inflight_mb", 512.0) * 2**20),
                  ui=not getattr(args, "no_ui", False))
    return engine, media, limits, app_kw


def check_args(args) -> None:
    """What can be checked before anything heavy: raises a user error (ValueError)."""
    d = pathlib.Path(args.media_dir)
    if not d.is_dir():
        raise UsageError(f"--media-dir {args.media_dir!r}: no such directory")
    if args.frames > args.max_frames:
        raise UsageError(f"--frames {args.frames} is over --max-frames {args.max_frames}")
    if args.max_new_tokens > args.max_tokens:
        raise UsageError(f"--max-new-tokens {args.max_new_tokens} is over --max-tokens "
                         f"{args.max_tokens}")
    # ask's own checks of --policy, --scorer, --model and --routers (same messages), each in
    # the stage it checks.
    from ..backbones import check_model_arg
    from ..planning.policies import check_policy
    from ..routing.routers import check_router_file
    from ..routing.scorers import DEFAULT_SCORER, check_scorer
    check_policy(args.policy)
    check_scorer(getattr(args, "scorer", DEFAULT_SCORER), getattr(args, "scorer_model", None))
    check_model_arg(args.model)
    check_router_file(args.routers)
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
    debug = os.environ.get("VIDEOROUTER_DEBUG", "") not in ("", "0")
    try:
        check_args(args)
        engine_cfg, media_cfg, _, app_kw = configs(args)
        sock = bind(args.host, args.port)
        from .app import create_app
        from .engine import Engine
        from .media import MediaStore
        media = MediaStore(media_cfg)
        if stderr_is_tty():   # as ask: say what the silent load is doing (terminals only)
            print(f"videorouter serve: loading model {args.model} ...", file=sys.stderr,
                  flush=True)
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
    from ..runtime.loading import warmup_line
    sys.stderr.write(f"videorouter serve: {warmup_line(engine.vr)}\n")
    sys.stderr.write(f"videorouter serve: http://{shown}:{port}/v1 model {engine.name!r}, media "
                     f"dir {str(media.root)!r}{note}\n")
    sys.stderr.flush()
    import uvicorn   # the serve extra
    served = logging.getLogger("videorouter.serve")
    served.setLevel(args.log_level.upper())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    served.addHandler(handler)
    served.propagate = False
    # The server's own access log (vr_runtime.serve.observe, at info: method, path, status,
    # latency, tokens) replaces uvicorn's.
    config = uvicorn.Config(app, log_level=args.log_level, access_log=False,
                            lifespan="off", timeout_graceful_shutdown=5)
    server = draining_server(uvicorn, config, engine, args.drain_timeout)
    try:
        server.run(sockets=[sock])
    finally:
        engine.close()
        media.close()
    if engine.busy:
        # A computation past the drain timeout: its client has its 503; the thread cannot be
        # stopped and would hold the interpreter's exit until it ends.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def draining_server(uvicorn, config, engine, drain_timeout: float):
    """A uvicorn server whose first SIGTERM/SIGINT drains instead of cutting connections.

    uvicorn alone stops listening, waits ``timeout_graceful_shutdown`` and then cancels whatever
    is still running -- those connections close with no answer -- and re-raises the signal, so
    the process does not exit 0. Here the first signal starts :meth:`Engine.drain`: the listener
    stays open and every new request is answered 503 + Retry-After (closing it would reset the
    connections waiting in its backlog), queued requests get their 503 at once, the running one
    gets ``drain_timeout`` seconds; then uvicorn's own shutdown closes the idle connections and
    the process exits 0. A second signal stops at once, as uvicorn does."""
    import asyncio   # not at the top: 20 ms on every `videorouter` start-up, --help included

    class DrainingServer(uvicorn.Server):
        _drain = None

        def handle_exit(self, sig, frame):
            if self._drain is not None:
                return super().handle_exit(sig, frame)
            self._drain = sig
            # A signal handler runs between two bytecodes of the loop's thread: hand the work
            # to the loop properly (this also wakes it).
            loop = asyncio.get_event_loop()
            loop.call_soon_threadsafe(lambda: loop.create_task(self._drain_then_exit(sig)))

        async def _drain_then_exit(self, sig):
            # Through the log's handler (its lock): a bare write to sys.stderr can be lost
            # beside the handler's writes.
            logging.getLogger("videorouter.serve").warning(
                "%s: draining (up to %g s for the running request)", signal.Signals(sig).name,
                drain_timeout)
            try:
                await engine.drain(drain_timeout)
            finally:
                self.should_exit = True

    return DrainingServer(config)
