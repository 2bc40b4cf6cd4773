"""``videorouter serve`` throughput on long clips, for one or two source trees.

    python -m bench.scripts.bench_serve_long --source /tmp/vr-before --source . \\
        [--requests 8] [--concurrency 1 4] [--frames 16] [--time-limit 900]

Makes (once, cached under ~/.cache/videorouter-bench/serve-long/) four distinct long clips with
ffmpeg: 1280x720, 30 fps, H.264 (libx264 veryfast, default keyframe interval 250), 60-78 s, each
with its own testsrc2 start offset and overlaid label so no two files are alike. For each
``--source`` tree it starts ``python -m vr_runtime.cli serve`` from that tree (PYTHONPATH and cwd
set to it; the module file the server imports is checked to be inside it) with the tiny model,
``--visual-cache 0`` (every request decodes its clip), on 127.0.0.1, warms it up with one request
on the bundled sample clip, then, for each ``--concurrency``, sends ``--requests`` requests spread
over the clips that many at a time, stopped at ``--time-limit``. Recorded: wall time, throughput, p50 /
p99 latency, statuses. Only flags and request fields that every measured tree accepts are used.
With two trees the results hold the second's throughput over the first's at each concurrency
(concurrency 1 shows the per-request speed; the overlap of decoding and model work shows above it).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

from bench.scripts.bench_serve import SAMPLE, _quantile, _video_body, serve

ROOT = pathlib.Path(__file__).resolve().parents[2]

CACHE = pathlib.Path.home() / ".cache" / "videorouter-bench" / "serve-long"
CLIPS = ((60, 0), (66, 7), (72, 13), (78, 21))   # (seconds, testsrc2 start offset in seconds)
QUESTION = "What is shown in the video?"


def make_clips() -> list:
    """The long clips, made once: distinct content (offset and label) and lengths."""
    CACHE.mkdir(parents=True, exist_ok=True)
    out = []
    for i, (secs, offset) in enumerate(CLIPS):
        path = CACHE / f"long{i}_{secs}s_720p30.mp4"
        if not path.exists():
            tmp = path.with_suffix(".part.mp4")
            subprocess.run(
                ["ffmpeg", "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i",
                 f"testsrc2=size=1280x720:rate=30,trim=start={offset},setpts=PTS-STARTPTS,"
                 f"drawbox=x={40 + 60 * i}:y=40:w=120:h=120:color=red@0.8:t=fill",
                 "-t", str(secs), "-c:v", "libx264", "-preset", "veryfast",
                 "-pix_fmt", "yuv420p", str(tmp)], check=True)
            tmp.rename(path)
        out.append(path)
    return out


@contextlib.contextmanager
def serve_from(source: pathlib.Path, media_dir, *extra, startup_timeout: float = 180.0):
    """bench_serve.serve, but from the given source tree: yields (Server, module file)."""
    # Prints the file the server's vr_runtime comes from, then runs the CLI as `videorouter`.
    boot = ("import sys, vr_runtime, vr_runtime.cli as c; "
            "print('VR_FILE=' + vr_runtime.__file__, file=sys.stderr, flush=True); "
            "sys.argv[0] = 'videorouter'; sys.exit(c.main())")
    with serve(media_dir, *extra, startup_timeout=startup_timeout, source=source,
               launcher=("-c", boot)) as server:
        text = pathlib.Path(server.stderr_path).read_text()
        yield server, re.search(r"VR_FILE=(\S+)", text).group(1)


async def _send(url, bodies, concurrency, time_limit):
    import httpx
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=time_limit) as client:
        async def one(body):
            async with sem:
                t0 = time.perf_counter()
                r = await client.post("/v1/chat/completions", json=body)
                return r.status_code, time.perf_counter() - t0
        tasks = [asyncio.ensure_future(one(b)) for b in bodies]
        done, pending = await asyncio.wait(tasks, timeout=time_limit)
        for t in pending:
            t.cancel()
        return [t.result() if t in done and t.exception() is None else (0, float("nan"))
                for t in tasks]


def _stats(res, wall) -> dict:
    lat = [dt for s, dt in res if s == 200]
    return {"statuses": [s for s, _ in res], "all_200": all(s == 200 for s, _ in res),
            "wall_s": round(wall, 2), "throughput_rps": round(len(lat) / wall, 4),
            "latency_s": {"p50": round(_quantile(lat, 0.5), 2),
                          "p99": round(_quantile(lat, 0.99), 2)}}


def _reset_peak_rss(pid: int) -> None:
    """Start the server's resident high-water mark over (Linux: clear_refs 5)."""
    with contextlib.suppress(OSError):
        pathlib.Path(f"/proc/{pid}/clear_refs").write_text("5")


def _peak_rss_mb(pid: int):
    """The server's resident high-water mark since the last reset, MB (None off Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        m = re.search(r"VmHWM:\s+(\d+) kB", pathlib.Path(f"/proc/{pid}/status").read_text())
        return round(int(m.group(1)) / 1024, 1)
    return None


def measure(source: pathlib.Path, clips, requests, concurrencies, frames, time_limit) -> dict:
    """One server from ``source``; the same requests at each concurrency in turn."""
    with tempfile.TemporaryDirectory(prefix="bench-serve-long-") as tmp:
        media = pathlib.Path(os.path.realpath(tmp))
        # Copies, not symlinks: the server refuses a path that resolves outside --media-dir.
        for c in (*clips, SAMPLE):
            shutil.copy(c, media / c.name)
        extra = ("--model", "tiny", "--device", "cpu", "--visual-cache", "0",
                 "--max-video-mb", "1024", "--max-queue", str(requests + 4),
                 "--max-frames", str(max(frames, 256)))
        settings = {"num_frames": frames, "max_tokens": 8, "policy": "auto"}
        with serve_from(source, media, *extra) as (server, vr_file):
            if not pathlib.Path(vr_file).resolve().is_relative_to(source.resolve()):
                raise RuntimeError(f"the server imported {vr_file}, not from {source}")
            warm = asyncio.run(_send(server.url, [_video_body(
                (media / "sample.mp4").as_uri(), QUESTION, settings)], 1, time_limit))
            bodies = [_video_body((media / clips[i % len(clips)].name).as_uri(), QUESTION,
                                  settings) for i in range(requests)]
            by_c = {}
            for c in concurrencies:
                _reset_peak_rss(server.proc.pid)
                t0 = time.perf_counter()
                res = asyncio.run(_send(server.url, bodies, c, time_limit))
                by_c[str(c)] = _stats(res, time.perf_counter() - t0)
                by_c[str(c)]["server_peak_rss_mb"] = _peak_rss_mb(server.proc.pid)
    commit = subprocess.run(["git", "-C", str(source), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    return {"source": str(source), "commit": commit, "vr_runtime_file": vr_file,
            "warmup_status": warm[0][0], "by_concurrency": by_c,
            "all_200": all(r["all_200"] for r in by_c.values())}


def _markdown(payload) -> str:
    env, trees = payload["environment"], payload["trees"]
    lines = ["# videorouter serve: throughput on long clips (CPU, tiny model, loopback)", "",
             f"- device: {env['device']}", f"- date (UTC): {env['date_utc']}",
             f"- load average (1 min) at start: {payload['load_avg_start']}",
             f"- versions: python {env['python']}, torch {env['torch']}, transformers "
             f"{env['transformers']}, PyAV {env['av']}",
             f"- command: `{env['command']}`",
             f"- clips: {payload['clips']}",
             f"- load: {payload['requests']} requests ({payload['frames']} frames, max_tokens 8, "
             f"policy auto, spread over the clips) at each concurrency, `--visual-cache 0`", "",
             "| tree | commit | concurrency | all 200 | wall (s) | throughput (req/s) | p50 (s) "
             "| p99 (s) | server peak RSS (MB) |", "|---|---|---:|:--:|---:|---:|---:|---:|---:|"]
    for r in trees:
        for c, m in r["by_concurrency"].items():
            lines.append(f"| {r['source']} | {r['commit']} | {c} | "
                         f"{'yes' if m['all_200'] else 'NO'} | {m['wall_s']} | "
                         f"{m['throughput_rps']} | {m['latency_s']['p50']} | "
                         f"{m['latency_s']['p99']} | {m.get('server_peak_rss_mb', '-')} |")
    for c, ratio in payload.get("ratio", {}).items():
        lines += ["", f"Concurrency {c}: throughput ratio (second / first) {ratio}x."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", action="append", default=None,
                   help="a source tree to serve from (repeat; default: this tree)")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--concurrency", type=int, nargs="+", default=[4])
    p.add_argument("--frames", type=int, default=16)
    p.add_argument("--time-limit", type=float, default=900.0)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve_long_cpu.json"))
    args = p.parse_args(argv)
    load = round(os.getloadavg()[0], 2)
    clips = make_clips()
    from bench.harness.env import environment
    from bench.harness.results import finish
    env = environment()
    env["av"] = __import__("av").__version__
    trees = [measure(pathlib.Path(s), clips, args.requests, args.concurrency, args.frames,
                     args.time_limit) for s in (args.source or [str(ROOT)])]
    payload = {"environment": env, "load_avg_start": load, "requests": args.requests,
               "concurrency": args.concurrency, "frames": args.frames,
               "clips": [c.name for c in clips], "trees": trees}
    if len(trees) == 2:
        a, b = (r["by_concurrency"] for r in trees)
        payload["ratio"] = {c: round(b[c]["throughput_rps"] / a[c]["throughput_rps"], 2)
                            for c in a if a[c]["throughput_rps"]}
    finish(args.out, payload, _markdown(payload))
    return 0 if all(r["all_200"] for r in trees) else 1


if __name__ == "__main__":
    sys.exit(main())
