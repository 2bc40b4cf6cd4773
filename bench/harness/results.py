"""Results files: one JSON payload a benchmark (with its environment), a markdown page beside
it, both replaced together; the runs of one benchmark kept in one file.

A results file is the payload of one run, or, once a run is appended to it (``--append``), a
``{"runs": [payload, ...]}`` of every run, oldest first, each with its own ``environment``
(device, date, versions, command). Fields beside ``runs``, where there are any, summarise them.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
from typing import Dict, List, Optional

from bench.harness.env import environment_line
from bench.harness.tables import markdown_table
from vr_runtime.data.atomic import write_files_atomically

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "results"


def add_append_flag(parser: argparse.ArgumentParser) -> None:
    """``--append``: keep the results file's earlier runs and add this one to them."""
    parser.add_argument("--append", action="store_true",
                        help="add this run to the results file's runs (its earlier runs are "
                             "kept) instead of replacing the file")


def runs_of(doc: Dict[str, object]) -> List[Dict[str, object]]:
    """The runs of a results file's contents, oldest first (a one-run file is its one run)."""
    runs = doc.get("runs")
    return list(runs) if isinstance(runs, list) else [doc]


def with_run(path: str, payload: Dict[str, object]) -> Dict[str, object]:
    """What ``path`` holds once ``payload`` is added as its newest run (the payload alone when
    there is no file yet)."""
    if not os.path.exists(path):
        return payload
    with open(path) as f:
        return {"runs": runs_of(json.load(f)) + [payload]}


def runs_table(runs: List[Dict[str, object]]) -> str:
    """The runs of a file as a markdown table: date, device, load and command of each."""
    rows = [dict(run=i + 1, **{k: (r.get("environment") or {}).get(k)
                               for k in ("date_utc", "device", "load_avg_1m", "command")})
            for i, r in enumerate(runs)]
    for r in rows:
        r["command"] = f"`{r['command']}`" if r["command"] else None
    return markdown_table(rows, ["run", "date_utc", "device", "load_avg_1m", "command"],
                          ["run", "date (UTC)", "device", "1-min load", "command"])


def write_results(path: str, payload: Dict[str, object], markdown: Optional[str] = None) -> str:
    """Write ``payload`` (which should contain ``environment()``) as JSON to ``path``.

    When ``markdown`` is given and ``path`` ends in ``.json``, a sibling ``.md`` with the same
    stem is written too (the human-readable table). Returns ``path``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    # A results file is either the old one or the whole new one, never half written; the JSON
    # and its markdown are replaced together.
    files = {path: json.dumps(payload, indent=2, default=str) + "\n"}
    if markdown is not None and path.endswith(".json"):
        files[path[:-5] + ".md"] = markdown.rstrip() + "\n"
    write_files_atomically(files)
    return path


def finish(path: str, payload: Dict[str, object], markdown: str, *, show: bool = True,
           append: bool = False) -> str:
    """The ending every benchmark shares: write the results (JSON + markdown), then print the
    markdown (``show``) and where it went. ``append``: the file keeps its earlier runs and
    its page ends with the table of them. Returns ``path``."""
    doc = with_run(path, payload) if append else payload
    if "runs" in doc:
        markdown = markdown.rstrip() + "\n\n## Runs in this file\n\n" + runs_table(doc["runs"])
    write_results(path, doc, markdown)
    if show:
        print(markdown)
    print(f"wrote {path}")
    return path


def report(out: str, title: str, env: Dict[str, object], notes: List[str], body: List[str], *,
           label: str, head: Optional[List[str]] = None, show: bool = True, append: bool = False,
           **fields) -> Dict[str, object]:
    """The ending most benchmarks share, written once: the markdown page (``title``, ``head``
    (default: the environment line), the notes as quotes, then ``body``'s lines) and the
    payload (environment, label, notes, then ``fields``), written and printed by ``finish``.
    Returns the payload."""
    head = [environment_line(env)] if head is None else head
    md = [title, ""] + head + [""] + [f"> {n}" for n in notes] + [""] + list(body)
    payload = dict(environment=env, label=label, notes=notes, **fields)
    finish(out, payload, "\n".join(md), show=show, append=append)
    return payload
