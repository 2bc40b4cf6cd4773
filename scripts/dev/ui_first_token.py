"""Time to the first token of what ``/ui`` sends against a plain API request: the same streamed
request to ``videorouter serve`` with and without ``videorouter_thumbnails``, alternated, each
decoding the video (``--visual-cache 0``), timed by the client from sending to the first content
chunk.

    python scripts/dev/ui_first_token.py [--pairs 10] [--frames 16] [--out FILE.md]

The server is the real command on 127.0.0.1 (bench/scripts/bench_serve.py starts and stops it).
The thumbnails are made on the decoding workers from the frames the request decodes anyway, so
the two columns should differ by noise only; this prints both medians and every pair.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))   # run as a file: the tree's bench package (bench.scripts.bench_serve)
QUESTION = "What shape is the red object?"


def _content(line: str) -> str:
    """The text a server-sent event's chunk carries ('' for the role chunk, the report, [DONE])."""
    if not line.startswith("data: {"):
        return ""
    choices = json.loads(line[len("data: "):]).get("choices") or [{}]
    return (choices[0].get("delta") or {}).get("content") or ""


def first_token_s(url: str, video: str, frames: int, thumbnails: bool) -> float:
    import httpx
    body = {"stream": True, "num_frames": frames, "max_length": 1400, "max_tokens": 16,
            "messages": [{"role": "user", "content": [
                {"type": "video_url", "video_url": {"url": video}},
                {"type": "text", "text": QUESTION}]}]}
    if thumbnails:
        body["videorouter_thumbnails"] = True
    t0, first = time.perf_counter(), None
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():       # to the end: the next request starts clean
            if first is None and _content(line):
                first = time.perf_counter() - t0
    if first is None:
        raise RuntimeError("no content chunk in the stream")
    return first


def measure(pairs: int, frames: int) -> list:
    from bench.scripts import bench_serve
    with tempfile.TemporaryDirectory() as tmp:
        media = bench_serve.make_media_dir(pathlib.Path(tmp))
        video = (media / "sample.mp4").as_uri()
        with bench_serve.serve(media, "--visual-cache", "0") as server:
            first_token_s(server.url, video, frames, False)      # warm-up, not counted
            return [(first_token_s(server.url, video, frames, False),
                     first_token_s(server.url, video, frames, True)) for _ in range(pairs)]


def markdown(rows: list, frames: int, command: str) -> str:
    api = statistics.median(a for a, _ in rows)
    ui = statistics.median(b for _, b in rows)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# First token: /ui's request against the plain API request", "",
             f"{when}, CPU ({os.cpu_count()} cores), tiny model, the sample clip at {frames} "
             f"frames, `--visual-cache 0` (every request decodes). Command: `{command}`", "",
             f"Median time to the first content chunk: API {api:.3f} s, with thumbnails "
             f"{ui:.3f} s ({ui - api:+.3f} s).", "", "| pair | API (s) | with thumbnails (s) |",
             "|---|---|---|"]
    lines += [f"| {i} | {a:.3f} | {b:.3f} |" for i, (a, b) in enumerate(rows, 1)]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--out", default=None, help="also write the table here (markdown)")
    a = ap.parse_args(argv)
    text = markdown(measure(a.pairs, a.frames), a.frames,
                    "python scripts/dev/ui_first_token.py " + " ".join(argv or sys.argv[1:]))
    sys.stdout.write(text)
    if a.out:
        pathlib.Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
