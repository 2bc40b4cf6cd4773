"""Load test of ``videorouter serve`` on the loopback address: bounded, self-stopping, checked.

    python -m bench.scripts.bench_serve [--requests 200] [--concurrency 16] [--frames 8]
                                [--time-limit 600] [--out bench/results/serve_cpu_tiny.json]

Starts ``videorouter serve`` (tiny model, a temporary media directory holding the bundled sample
clip and a corrupt file) on 127.0.0.1 with a free port, and first asks ``videorouter ask --json``
the same questions with the same settings: those are the expected answers. Then it sends
``--requests`` requests, ``--concurrency`` at a time, a fixed shuffled mix of good ones (several
questions, frame counts and policies, file:// and data: videos, top-level and
``mm_processor_kwargs`` settings, streamed and not) and bad ones (a path outside the media
directory: 403; a corrupt video: 422 with the CLI's message; malformed JSON, a wrong type, no
video: 400; a remote URL: 403). It stops by itself: after the last answer, or at
``--time-limit`` seconds, which counts as a failure.

Checked: every request is answered (none lost), every good answer equals ``videorouter ask``
byte for byte, every bad one has its status and an OpenAI-style error object, and the server's
resident memory (``/proc/PID/status``, sampled every 0.2 s) stays flat: after a warm-up pass over
every distinct request, growth over the run must stay under ``--rss-slack-mb``. Written: p50 and
p99 latency, throughput, the memory series, to ``--out`` (JSON) and a Markdown sibling, naming
device, date, versions and the command. The process exits 1 if any check fails.

``tests/serve/test_serve_http.py`` runs a smaller version of the same thing (40 requests, 8 at a
time) through :func:`run_benchmark`.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import pathlib
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

ROOT = pathlib.Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "vr_runtime" / "assets" / "sample.mp4"
QUESTIONS = ("What shape is the red object?", "What color is the background?",
             "How many objects are there?")


# ----------------------------------------------------------------------------- the server

@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    stderr_path: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@contextlib.contextmanager
def serve(media_dir, *extra, startup_timeout: float = 180.0, source: pathlib.Path = ROOT,
          launcher=("-m", "vr_runtime.cli")):
    """``videorouter serve --port 0`` on 127.0.0.1 as a subprocess, run from the source tree
    ``source`` (``python LAUNCHER serve ...``); yields a :class:`Server`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(source) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    log = tempfile.NamedTemporaryFile("w+", prefix="videorouter-serve-", suffix=".log",
                                      delete=False)
    cmd = [sys.executable, *launcher, "serve", "--host", "127.0.0.1", "--port", "0",
           "--media-dir", str(media_dir), *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=env, cwd=str(source))
    server = None
    try:
        t0 = time.monotonic()
        while True:
            text = pathlib.Path(log.name).read_text()
            m = re.search(r"http://127\.0\.0\.1:(\d+)/v1", text)
            if m:
                server = Server(proc, int(m.group(1)), log.name)
                break
            if proc.poll() is not None:
                raise RuntimeError(f"videorouter serve exited with {proc.returncode}: {text}")
            if time.monotonic() - t0 > startup_timeout:
                raise RuntimeError(f"videorouter serve did not start in {startup_timeout} s: {text}")
            time.sleep(0.2)
        yield server
    finally:
        if server is not None:
            server.stop()
        elif proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()
        os.unlink(log.name)


# ----------------------------------------------------------------------------- the requests

@dataclass
class Case:
    """One distinct request and what must come back."""
    name: str
    status: int
    body: Optional[dict] = None           # JSON body (None: ``raw`` is sent as is)
    raw: Optional[bytes] = None
    ask: Optional[tuple] = None           # (question, frames, max_length, max_new_tokens, policy)
    stream: bool = False
    message: Optional[str] = None         # the exact error message expected (422: the CLI's)


def _video_body(url, question, extra: dict, stream=False) -> dict:
    body = {"model": "tiny", "messages": [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": question}]}]}
    body.update(extra)
    if stream:
        body["stream"] = True
    return body


def make_cases(media_dir: pathlib.Path, frames=(8, 6), max_length=1400,
               max_new_tokens=16, questions=QUESTIONS) -> List[Case]:
    """Good cases over the questions x frame counts x ways of giving settings, and bad cases."""
    clip = media_dir / "sample.mp4"
    file_url = clip.as_uri()
    data_url = "data:video/mp4;base64," + base64.b64encode(clip.read_bytes()).decode()
    cases = []
    for qi, q in enumerate(questions):
        for fi, f in enumerate(frames):
            policy = "auto" if (qi + fi) % 2 == 0 else "global"
            ask = (q, f, max_length, max_new_tokens, policy)
            top = {"num_frames": f, "max_length": max_length, "max_tokens": max_new_tokens,
                   "policy": policy}
            mm = {"max_tokens": max_new_tokens, "mm_processor_kwargs": {
                "num_frames": f, "max_length": max_length, "policy": policy}}
            cases.append(Case(f"q{qi}-f{f}-top", 200, _video_body(file_url, q, top), ask=ask))
            cases.append(Case(f"q{qi}-f{f}-mm-stream", 200, _video_body(file_url, q, mm, True),
                              ask=ask, stream=True))
            if fi == 0:
                cases.append(Case(f"q{qi}-f{f}-data", 200, _video_body(data_url, q, top), ask=ask))
    outside = media_dir.parent / "outside.mp4"
    escape = f"file://{media_dir}/../{outside.name}"
    cases += [
        Case("outside-media-dir", 403, _video_body(escape, QUESTIONS[0], {})),
        Case("symlink-out", 403, _video_body((media_dir / "link.mp4").as_uri(), QUESTIONS[0], {})),
        Case("corrupt-video", 422, _video_body((media_dir / "corrupt.mp4").as_uri(),
                                               QUESTIONS[0], {"num_frames": frames[0]})),
        Case("malformed-json", 400, raw=b'{"messages": [}'),
        Case("wrong-type", 400, _video_body(file_url, QUESTIONS[0], {"num_frames": "8"})),
        Case("no-video", 400, {"messages": [{"role": "user", "content": "hello"}]}),
        Case("remote-url", 403, _video_body("https://example.com/v.mp4", QUESTIONS[0], {})),
    ]
    return cases


def make_media_dir(root: pathlib.Path) -> pathlib.Path:
    media = pathlib.Path(os.path.realpath(root)) / "media"   # the server reports real paths
    media.mkdir(parents=True, exist_ok=True)
    shutil.copy(SAMPLE, media / "sample.mp4")
    # A file that starts like an MP4 and stops: not a usable video.
    (media / "corrupt.mp4").write_bytes(SAMPLE.read_bytes()[:2000])
    shutil.copy(SAMPLE, media.parent / "outside.mp4")
    os.symlink(media.parent / "outside.mp4", media / "link.mp4")
    return media


# ----------------------------------------------------------------------------- expectations

def ask_json(video, question, frames, max_length, max_new_tokens, policy) -> dict:
    """``videorouter ask ... --json`` as a command: {"text", "report"}."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "vr_runtime.cli", "ask", str(video), question, "--frames",
           str(frames), "--max-length", str(max_length), "--max-new-tokens", str(max_new_tokens),
           "--policy", policy, "--device", "cpu", "--json"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    if res.returncode != 0:
        return {"error": res.stderr.strip(), "returncode": res.returncode}
    return json.loads(res.stdout)


def expectations(cases: List[Case], media_dir: pathlib.Path, ask=ask_json) -> Dict[tuple, dict]:
    """The expected ``ask --json`` output per distinct setting, and the CLI's line for the
    corrupt video (stored into that case's ``message``)."""
    out = {}
    for c in cases:
        if c.ask is not None and c.ask not in out:
            out[c.ask] = ask(media_dir / "sample.mp4", *c.ask)
        if c.name == "corrupt-video":
            res = ask(media_dir / "corrupt.mp4", QUESTIONS[0], 8, 1400, 16, "auto")
            prefix = "videorouter: error: "
            line = res.get("error", "")
            c.message = line[len(prefix):] if line.startswith(prefix) else line
    return out


# ----------------------------------------------------------------------------- the load

@dataclass
class Result:
    case: str
    status: int
    latency_s: float
    ok: bool
    problem: str = ""


def _content(resp_bytes: bytes, stream: bool):
    if not stream:
        d = json.loads(resp_bytes)
        return d["choices"][0]["message"]["content"], d
    text, last, events = "", None, resp_bytes.decode().split("\n\n")
    if events[-2:] != ["data: [DONE]", ""]:
        raise ValueError("the stream does not end with data: [DONE]")
    for ev in events[:-2]:
        obj = json.loads(ev[len("data: "):])
        for ch in obj["choices"]:
            text += ch["delta"].get("content") or ""
            last = obj
    return text, last


def check(case: Case, status: int, body: bytes, expected: Dict[tuple, dict]) -> str:
    """'' when the answer is right, else what is wrong."""
    if status != case.status:
        return f"status {status}, expected {case.status}: {body[:300]!r}"
    try:
        if case.status == 200:
            text, obj = _content(body, case.stream)
            want = expected[case.ask]
            if "text" not in want:
                return f"videorouter ask failed on this input: {want}"
            if text != want["text"]:
                return f"answer {text!r} != videorouter ask's {want['text']!r}"
            if obj.get("videorouter", {}).get("frame_indices") != want["report"]["frame_indices"]:
                return "report frame_indices differ from videorouter ask's"
            return ""
        err = json.loads(body)["error"]
        if not (isinstance(err.get("message"), str) and err.get("code") == case.status
                and isinstance(err.get("type"), str)):
            return f"not an OpenAI-style error object: {body[:300]!r}"
        if "\n" in err["message"] or "Traceback" in err["message"]:
            return f"error message is not one line: {err['message']!r}"
        if case.message is not None and err["message"] != case.message:
            return f"message {err['message']!r} != the CLI's {case.message!r}"
        return ""
    except Exception as e:  # noqa: BLE001 - any unreadable answer is a failure to report
        return f"unreadable answer ({type(e).__name__}: {e}): {body[:300]!r}"


async def _load(url: str, sequence: List[Case], concurrency: int, time_limit: float,
                expected) -> List[Result]:
    import httpx
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=time_limit, limits=limits) as client:
        async def one(case: Case) -> Result:
            async with sem:
                t0 = time.perf_counter()
                content = case.raw if case.body is None else json.dumps(case.body).encode()
                r = await client.post("/v1/chat/completions", content=content,
                                      headers={"content-type": "application/json"})
                dt = time.perf_counter() - t0
                problem = check(case, r.status_code, r.content, expected)
                return Result(case.name, r.status_code, dt, not problem, problem)

        tasks = [asyncio.ensure_future(one(c)) for c in sequence]
        done, pending = await asyncio.wait(tasks, timeout=time_limit)
        for t in pending:
            t.cancel()
        out = []
        for c, t in zip(sequence, tasks):
            if t in done and t.exception() is None:
                out.append(t.result())
            else:
                why = "no answer before --time-limit" if t in pending else repr(t.exception())
                out.append(Result(c.name, 0, float("nan"), False, why))
        return out


class RSSSampler:
    def __init__(self, server: Server, every_s: float = 0.2):
        self.server, self.every_s = server, every_s
        self.samples: List[tuple] = []
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                self.samples.append((round(time.monotonic() - self._t0, 2),
                                     self.server.rss_bytes()))
            self._stop.wait(self.every_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _quantile(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    pos = q * (len(xs) - 1)
    lo, hi = int(pos), min(int(pos) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def run_benchmark(workdir: pathlib.Path, requests: int = 200, concurrency: int = 16,
                  frames=(8, 6), time_limit: float = 600.0, rss_slack_mb: float = 64.0,
                  seed: int = 0, ask=ask_json, questions=QUESTIONS,
                  server: Optional[Server] = None, media: Optional[pathlib.Path] = None,
                  server_args=()) -> dict:
    """Everything above; returns the results dict (``passed`` says whether every check held).
    ``server``/``media``: a server already started by :func:`serve` on ``media`` (made by
    :func:`make_media_dir`) instead of a new one."""
    media = media or make_media_dir(pathlib.Path(workdir))
    cases = make_cases(media, frames=frames, questions=questions)
    expected = expectations(cases, media, ask)
    rng = random.Random(seed)
    sequence = [cases[i % len(cases)] for i in range(requests)]
    rng.shuffle(sequence)
    with contextlib.ExitStack() as stack:
        if server is None:
            server = stack.enter_context(serve(media, "--max-queue",
                                               str(max(64, concurrency * 2)), *server_args))
        with RSSSampler(server) as rss:
            t_warm = time.monotonic()
            warm = asyncio.run(_load(server.url, cases, concurrency, time_limit, expected))
            warm_s = time.monotonic() - t_warm
            rss_after_warmup = server.rss_bytes()
            t0 = time.perf_counter()
            results = asyncio.run(_load(server.url, sequence, concurrency,
                                        max(time_limit - warm_s, 1.0), expected))
            wall = time.perf_counter() - t0
            rss_end = server.rss_bytes()
        alive = server.proc.poll() is None
    lat = [r.latency_s for r in results if r.status]
    good = [r.latency_s for r, c in zip(results, sequence) if c.status == 200 and r.status]
    growth_mb = (rss_end - rss_after_warmup) / 2**20
    failures = [r.__dict__ for r in warm + results if not r.ok]
    by_status: Dict[str, int] = {}
    for r in results:
        by_status[str(r.status)] = by_status.get(str(r.status), 0) + 1
    return {
        "requests": requests, "concurrency": concurrency, "frames": list(frames),
        "distinct_requests": len(cases), "answered": sum(1 for r in results if r.status),
        "correct": sum(1 for r in results if r.ok), "by_status": by_status,
        "wall_s": round(wall, 3), "throughput_rps": round(len(lat) / wall, 3) if wall else None,
        "latency_s": {"p50": round(_quantile(lat, 0.5), 4), "p99": round(_quantile(lat, 0.99), 4),
                      "max": round(max(lat), 4) if lat else None,
                      "mean": round(statistics.fmean(lat), 4) if lat else None},
        "latency_good_s": {"p50": round(_quantile(good, 0.5), 4),
                           "p99": round(_quantile(good, 0.99), 4)},
        "rss_mb": {"after_warmup": round(rss_after_warmup / 2**20, 1),
                   "end": round(rss_end / 2**20, 1),
                   "max": round(max(b for _, b in rss.samples) / 2**20, 1),
                   "growth": round(growth_mb, 1), "slack": rss_slack_mb,
                   "series": [(t, round(b / 2**20, 1)) for t, b in rss.samples[::5]]},
        "server_alive_after": alive,
        "failures": failures[:20], "failure_count": len(failures),
        "passed": (not failures and alive and growth_mb < rss_slack_mb
                   and len(results) == requests),
    }


def _markdown(res: dict, env: dict) -> str:
    lines = ["# videorouter serve: load test (CPU, tiny model, loopback)", "",
             f"- device: {env['device']}", f"- date (UTC): {env['date_utc']}",
             f"- versions: python {env['python']}, torch {env['torch']}, transformers "
             f"{env['transformers']}, fastapi {env.get('fastapi')}, uvicorn {env.get('uvicorn')}",
             f"- command: `{env['command']}`",
             f"- machine load (1-min average at the end): {env.get('load_avg_1m')} -- a shared "
             f"2-core machine; latencies are noisy", "",
             "| requests | concurrency | answered | correct | p50 (s) | p99 (s) | throughput "
             "(req/s) | RSS after warm-up (MB) | RSS end (MB) | growth (MB) | passed |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:--:|",
             f"| {res['requests']} | {res['concurrency']} | {res['answered']} | {res['correct']} "
             f"| {res['latency_s']['p50']} | {res['latency_s']['p99']} | {res['throughput_rps']} "
             f"| {res['rss_mb']['after_warmup']} | {res['rss_mb']['end']} | "
             f"{res['rss_mb']['growth']} | {'yes' if res['passed'] else 'NO'} |", "",
             f"Statuses: {res['by_status']} (good requests: 200; bad: 400/403/422 by design). "
             f"Good-request latency p50 {res['latency_good_s']['p50']} s, p99 "
             f"{res['latency_good_s']['p99']} s. Frames per request: {res['frames']}. "
             f"Every 200 answer was compared byte for byte with `videorouter ask --json` on the "
             f"same input and settings. Server `--visual-cache {res.get('visual_cache')}` "
             f"(0: no reuse of decoded frames / Z / router state across requests; every request "
             f"here is on the same clip, so with reuse most are cache hits). Latency is "
             f"client-side, queueing included (one model, requests in turn).", ""]
    if res["failures"]:
        lines += ["Failures:", ""] + [f"- {f}" for f in res["failures"]]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--frames", type=int, nargs="+", default=[8, 6])
    p.add_argument("--time-limit", type=float, default=600.0)
    p.add_argument("--rss-slack-mb", type=float, default=64.0)
    p.add_argument("--visual-cache", type=int, default=4,
                   help="the server's --visual-cache (0: no reuse across requests)")
    p.add_argument("--out", default=None,
                   help="default: bench/results/serve_cpu_tiny.json (serve_cpu_tiny_nocache.json "
                        "with --visual-cache 0)")
    args = p.parse_args(argv)
    if args.out is None:
        stem = "serve_cpu_tiny" + ("_nocache" if args.visual_cache == 0 else "")
        args.out = str(ROOT / "bench" / "results" / f"{stem}.json")
    from bench.harness.env import environment
    from bench.harness.results import finish
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        res = run_benchmark(pathlib.Path(tmp), args.requests, args.concurrency,
                            tuple(args.frames), args.time_limit, args.rss_slack_mb,
                            server_args=("--visual-cache", str(args.visual_cache)))
    res["visual_cache"] = args.visual_cache
    env = environment()
    for mod in ("fastapi", "uvicorn", "httpx"):
        with contextlib.suppress(Exception):
            env[mod] = __import__(mod).__version__
    payload = {"environment": env, "results": res}
    finish(args.out, payload, _markdown(res, env), show=False)
    print(json.dumps({k: v for k, v in res.items() if k != "rss_mb"} | {
        "rss_mb": {k: v for k, v in res["rss_mb"].items() if k != "series"}}, indent=1))
    return 0 if res["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
