"""Benchmark readers: the published layouts of Video-MME, LongVideoBench and MLVU, and a generic
JSONL, read from local files into one :class:`Question` type (docs/CONTRACT.md section 5).

| benchmark | file | fields used |
|---|---|---|
| ``videomme`` | parquet (``videomme/test-*.parquet``, as on the Hub) or JSON rows | ``videoID``, ``question_id``, ``duration``, ``domain``, ``sub_category``, ``task_type``, ``question``, ``options`` ["A. ...", ...], ``answer`` (letter) |
| ``longvideobench`` | ``lvb_val.json`` | ``video_path``, ``question``, ``candidates``, ``correct_choice`` (index), ``duration_group``, ``question_category`` (``id`` when present) |
| ``mlvu`` | per-task JSON (``json/1_plotQA.json``, ...) | ``video``, ``question``, ``candidates``, ``answer`` (option text), ``question_type`` |
| ``jsonl`` | one object a line | ``id``, ``video``, ``question``, ``options`` (texts or "A. text"), ``answer`` (letter or option text), optional ``category``, ``duration`` |

Every error is a :class:`BenchmarkError` (a ``ValueError``) that names ``file:line`` (``file:row
N`` for parquet) and the field. Video paths are resolved against ``--videos`` here, so a missing
video is found before any model loads.
"""
from __future__ import annotations

import json
import pathlib
import re
import string
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

LETTERS = string.ascii_uppercase
VIDEO_EXTS = (".mp4", ".MP4", ".mkv", ".webm", ".avi", ".mov")
_OPTION_RE = re.compile(r"^\s*\(?([A-Z])[.:)]\s*(.*)$", re.S)


class BenchmarkError(ValueError):
    """A benchmark file that cannot be used: missing, malformed row, missing video."""


@dataclass
class Question:
    id: str
    video: Optional[str]              # resolved path (None: missing and skipped)
    question: str                     # the bare question (what the routers read)
    options: List[str]                # option texts, without their letters
    answer: str                       # the correct letter
    category: str = ""                # task type / question category
    duration: str = ""                # duration group ("short", "medium", "long", "600", ...)
    where: str = ""                   # file:line, for messages
    extra: Dict[str, object] = field(default_factory=dict)

    @property
    def letters(self) -> str:
        return LETTERS[:len(self.options)]


@dataclass
class Benchmark:
    name: str
    questions: List[Question]
    skipped: List[Tuple[str, str]] = field(default_factory=list)   # (where, reason)


# ----------------------------------------------------------------------------- file reading
def iter_json_rows(path: pathlib.Path) -> Iterator[Tuple[int, object]]:
    """(line, row) for a JSON array of objects (line = where the row starts), or for JSON
    Lines when the file does not start with ``[``."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise BenchmarkError(f"{path}: cannot be read ({e})") from None
    stripped = text.lstrip()
    if not stripped.startswith("["):
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                yield i, json.loads(line)
            except json.JSONDecodeError as e:
                raise BenchmarkError(f"{path}:{i}: not valid JSON ({e.msg})") from None
        return
    dec = json.JSONDecoder()
    pos = len(text) - len(stripped) + 1
    n = len(text)
    while True:
        while pos < n and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= n:
            raise BenchmarkError(f"{path}:{text.count(chr(10), 0, n) + 1}: the JSON array is "
                                 f"not closed")
        if text[pos] == "]":
            return
        line = text.count("\n", 0, pos) + 1
        try:
            obj, pos = dec.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise BenchmarkError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
        yield line, obj


def iter_parquet_rows(path: pathlib.Path) -> Iterator[Tuple[str, dict]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise BenchmarkError(f"{path}: reading parquet needs pyarrow (pip install pyarrow, or "
                             f"pip install 'videorouter[eval]')") from None
    try:
        rows = pq.read_table(str(path)).to_pylist()
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise BenchmarkError(f"{path}: not a readable parquet file ({e})") from None
    for i, row in enumerate(rows):
        yield f"row {i}", row


def _rows(path: pathlib.Path) -> Iterator[Tuple[str, object]]:
    if path.suffix == ".parquet":
        yield from iter_parquet_rows(path)
    else:
        for line, row in iter_json_rows(path):
            yield str(line), row


def _data_files(data: pathlib.Path, patterns: Sequence[str]) -> List[pathlib.Path]:
    if data.is_file():
        return [data]
    if not data.is_dir():
        raise BenchmarkError(f"--data {str(data)!r}: no such file or directory")
    for pat in patterns:
        found = sorted(p for p in data.rglob(pat) if p.is_file())
        if found:
            return found
    raise BenchmarkError(f"--data {str(data)!r}: no {' or '.join(patterns)} file in it")


# ----------------------------------------------------------------------------- field checks
class _Row:
    """Field access on one row with file:line errors."""

    def __init__(self, where: str, row, index: int = 0):
        if not isinstance(row, dict):
            raise BenchmarkError(f"{where}: expected a JSON object, got {type(row).__name__}")
        self.where, self.row, self.index = where, row, index

    def str(self, key: str, required: bool = True, default: str = "") -> str:
        v = self.row.get(key)
        if v is None or (isinstance(v, str) and not v.strip()):
            if required:
                raise BenchmarkError(f"{self.where}: field {key!r} is missing or empty")
            return default
        if isinstance(v, (dict, list)):
            raise BenchmarkError(f"{self.where}: field {key!r}: expected a string, got "
                                 f"{type(v).__name__}")
        return str(v)

    def list(self, key: str) -> List[str]:
        v = self.row.get(key)
        if hasattr(v, "tolist"):
            v = v.tolist()
        if not isinstance(v, (list, tuple)) or len(v) < 2 or len(v) > len(LETTERS):
            raise BenchmarkError(f"{self.where}: field {key!r}: expected a list of 2 to "
                                 f"{len(LETTERS)} options, got {v!r:.80}")
        if any(not isinstance(x, (str, int, float)) or not str(x).strip() for x in v):
            raise BenchmarkError(f"{self.where}: field {key!r}: every option must be a "
                                 f"non-empty string")
        return [str(x) for x in v]


def split_options(opts: Sequence[str]) -> List[str]:
    """["A. cat", "B. dog"] -> ["cat", "dog"] when every option carries its letter in order;
    plain texts are returned as they are."""
    parsed = [_OPTION_RE.match(o) for o in opts]
    if all(m is not None and m.group(1) == LETTERS[i] for i, m in enumerate(parsed)):
        return [m.group(2).strip() for m in parsed]
    return [str(o).strip() for o in opts]


def _letter(r: _Row, key: str, options: List[str], value=None) -> str:
    """The answer as a letter: a letter, an index (int) or the option's text."""
    v = r.row.get(key) if value is None else value
    n = len(options)
    if isinstance(v, bool) or v is None:
        raise BenchmarkError(f"{r.where}: field {key!r} is missing")
    if isinstance(v, int) or (isinstance(v, float) and float(v).is_integer()):
        if not 0 <= int(v) < n:
            raise BenchmarkError(f"{r.where}: field {key!r}: index {v} outside the {n} options")
        return LETTERS[int(v)]
    s = str(v).strip()
    m = _OPTION_RE.match(s)
    if len(s) == 1 and s.upper() in LETTERS[:n]:
        return s.upper()
    if m and m.group(1) in LETTERS[:n] and m.group(2).strip() == options[LETTERS.index(m.group(1))]:
        return m.group(1)
    norm = [o.strip().lower() for o in options]
    if s.lower() in norm:
        return LETTERS[norm.index(s.lower())]
    raise BenchmarkError(f"{r.where}: field {key!r}: {s!r:.60} is neither an option letter "
                         f"({LETTERS[0]}-{LETTERS[n - 1]}) nor one of the options")


def _find_video(videos: pathlib.Path, names: Sequence[str]) -> Optional[pathlib.Path]:
    for name in names:
        p = videos / name
        if p.is_file():
            return p
        if not pathlib.Path(name).suffix:
            for ext in VIDEO_EXTS:
                q = videos / (name + ext)
                if q.is_file():
                    return q
    return None


# ----------------------------------------------------------------------------- the layouts
def _videomme(r: _Row, videos: pathlib.Path, src: pathlib.Path):
    vid = r.str("videoID")
    options = split_options(r.list("options"))
    q = Question(id=r.str("question_id"), video=None, question=r.str("question"),
                 options=options, answer=_letter(r, "answer", options),
                 category=r.str("task_type", False), duration=r.str("duration", False),
                 where=r.where, extra={"domain": r.str("domain", False),
                                       "sub_category": r.str("sub_category", False)})
    return q, [vid, f"data/{vid}"], "videoID"


def _longvideobench(r: _Row, videos: pathlib.Path, src: pathlib.Path):
    options = split_options(r.list("candidates"))
    rel = r.str("video_path")
    qid = r.str("id", False) or f"{src.stem}-{r.index}"
    q = Question(id=qid, video=None, question=r.str("question"), options=options,
                 answer=_letter(r, "correct_choice", options),
                 category=r.str("question_category", False),
                 duration=r.str("duration_group", False), where=r.where)
    return q, [rel, f"videos/{rel}"], "video_path"


def _mlvu(r: _Row, videos: pathlib.Path, src: pathlib.Path):
    options = split_options(r.list("candidates"))
    name = r.str("video")
    task = src.stem                              # "1_plotQA"
    q = Question(id=r.str("question_id", False) or f"{task}-{r.index}", video=None,
                 question=r.str("question"), options=options,
                 answer=_letter(r, "answer", options), category=r.str("question_type", False)
                 or task, duration=r.str("duration", False), where=r.where)
    return q, [f"{task}/{name}", name, f"video/{task}/{name}"], "video"


def _jsonl(r: _Row, videos: pathlib.Path, src: pathlib.Path):
    options = split_options(r.list("options"))
    q = Question(id=r.str("id"), video=None, question=r.str("question"), options=options,
                 answer=_letter(r, "answer", options), category=r.str("category", False),
                 duration=r.str("duration", False), where=r.where)
    return q, [r.str("video")], "video"


# name -> (row parser, data-file patterns)
READERS: Dict[str, Tuple[Callable, Tuple[str, ...]]] = {
    "videomme": (_videomme, ("*.parquet", "*.json", "*.jsonl")),
    "longvideobench": (_longvideobench, ("lvb_val.json", "*.json")),
    "mlvu": (_mlvu, ("*.json",)),
    "jsonl": (_jsonl, ("*.jsonl",)),
}


def load_benchmark(name: str, data, videos, skip_missing: bool = False,
                   limit: Optional[int] = None) -> Benchmark:
    """Read ``name``'s questions from ``data`` (a file or a folder) with videos under
    ``videos``. A missing video raises unless ``skip_missing`` (then it is counted)."""
    if name not in READERS:
        raise BenchmarkError(f"--benchmark {name!r}: expected one of {', '.join(READERS)}")
    parse, patterns = READERS[name]
    data = pathlib.Path(data)
    videos = pathlib.Path(videos)
    if not videos.is_dir():
        raise BenchmarkError(f"--videos {str(videos)!r}: no such directory")
    bench = Benchmark(name, [])
    seen: Dict[str, str] = {}
    for src in _data_files(data, patterns):
        for index, (where, row) in enumerate(_rows(src)):
            r = _Row(f"{src}:{where}", row, index)
            q, names, vfield = parse(r, videos, src)
            if q.id in seen:
                raise BenchmarkError(f"{r.where}: field 'id': {q.id!r} repeats {seen[q.id]}")
            seen[q.id] = r.where
            path = _find_video(videos, names)
            if path is None:
                msg = f"{r.where}: field {vfield!r}: video {names[0]!r} not found under {videos}"
                if not skip_missing:
                    raise BenchmarkError(msg + " (pass --skip-missing to skip such questions)")
                bench.skipped.append((r.where, f"missing video {names[0]}"))
                continue
            q.video = str(path)
            bench.questions.append(q)
            if limit and len(bench.questions) >= limit:
                return bench
    if not bench.questions and not bench.skipped:
        raise BenchmarkError(f"--data {str(data)!r}: no questions in it")
    return bench


__all__ = ["BenchmarkError", "Question", "Benchmark", "READERS", "load_benchmark",
           "split_options", "iter_json_rows", "LETTERS"]
