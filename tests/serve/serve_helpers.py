"""Shared by the serve tests: ``videorouter ask --json`` in-process, and report comparison."""
import contextlib
import copy
import functools
import io
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "vr_runtime" / "assets" / "sample.mp4"

# Report fields that differ between two runs of the same request by nature: stage timings,
# memory, whether the visual cache hit, and the scorer's name when the cache is on
# ("image-router-cached" is the same Image Router with its question-independent part reused).
VOLATILE = ("timings_s", "visual_cache", "peak_memory_bytes", "peak_memory_nvml_bytes",
            "peak_activation_bytes")


def ask(video, question, frames, max_length, max_new_tokens, policy, model="tiny") -> dict:
    """``videorouter ask VIDEO QUESTION ... --json`` through ``vr_runtime.cli.main`` (the command's
    own code, without a new interpreter): {"text", "report"}, or {"error": line}. Memoised per
    argument set (the command is deterministic; each call loads the model)."""
    return copy.deepcopy(_ask(str(video), question, frames, max_length, max_new_tokens, policy,
                              model))


@functools.lru_cache(maxsize=None)
def _ask(video, question, frames, max_length, max_new_tokens, policy, model) -> dict:
    from vr_runtime import cli
    out, err = io.StringIO(), io.StringIO()
    argv = ["ask", str(video), question, "--frames", str(frames), "--max-length",
            str(max_length), "--max-new-tokens", str(max_new_tokens), "--policy", policy,
            "--model", model, "--device", "cpu", "--json"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(argv)
        except SystemExit as e:
            rc = e.code
    if rc:
        return {"error": err.getvalue().strip().splitlines()[-1], "returncode": rc}
    return json.loads(out.getvalue())


def stable(report: dict) -> dict:
    r = {k: v for k, v in report.items() if k not in VOLATILE}
    if isinstance(r.get("scorer"), str):
        r["scorer"] = r["scorer"].replace("-cached", "")
    r["notes"] = [n for n in r.get("notes") or [] if not n.startswith("visual cache hit")]
    return r


def video_body(url, question, **extra) -> dict:
    body = {"model": "tiny", "messages": [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": question}]}]}
    body.update(extra)
    return body


def sse_text(raw: bytes):
    """(content, the chunks) of a server-sent-events body; asserts it ends with [DONE]."""
    events = raw.decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""], events[-3:]
    chunks = [json.loads(e[len("data: "):]) for e in events[:-2]]
    text = "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"])
    return text, chunks
