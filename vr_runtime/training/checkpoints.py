"""Checkpoints that survive ``kill -9``: written whole or not at all, found and checked on resume.

A checkpoint is written into ``checkpoint-<step>.tmp`` (accelerate's state, the routers, then
``trainer_state.json`` last, with the size of every other file in it), every file and the
folder are fsynced, and only then is the folder renamed to ``checkpoint-<step>``. A kill at any
moment leaves either no ``checkpoint-<step>`` or a complete one; a complete checkpoint is never
rewritten in place (a second save of the same step goes through a new temporary folder and a
rename, the old one is removed only after the new one is in place).

On resume, a checkpoint counts as complete when its ``trainer_state.json`` parses, has the
expected keys and names its own step, and every file it lists has the recorded size (which
catches a truncated weights file). ``--resume latest`` takes the newest complete one and says in
one line which torn ones it skipped; a problem with an explicitly named checkpoint is one
``CheckpointError`` line.

Retention (``save_total_limit``, :func:`prune`): after a new checkpoint is committed, only the
newest ``save_total_limit`` complete ones stay, plus the one this run resumed from. A checkpoint
is removed by renaming it to ``checkpoint-<step>.del`` first (atomic) and deleting that, oldest
first, so a kill during the pruning leaves every kept checkpoint complete and at most one
``.del`` folder, which :func:`tidy` removes at the next start.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
from typing import List, Optional, Sequence, Tuple

from ..data.atomic import fsync_path, write_atomic

STATE = "trainer_state.json"
PREFIX = "checkpoint-"
TMP = ".tmp"     # a checkpoint being written (removed at the next start)
OLD = ".old"     # a complete checkpoint being replaced by a new save of the same step
DEL = ".del"     # a checkpoint being deleted by prune() (removed at the next start)
_NAME = re.compile(r"^checkpoint-(\d+)$")
_STATE_KEYS = {"global_step": int, "epoch": int, "micro_step_in_epoch": int, "history": list}


class CheckpointError(ValueError):
    """A checkpoint that is missing, torn or unreadable (one line: which, and what to do)."""


def checkpoint_dir(output_dir: str, step: int) -> str:
    return os.path.join(output_dir, f"{PREFIX}{step}")


def _files(folder: str) -> List[str]:
    """Every file under ``folder``, relative, sorted."""
    out = []
    for root, _, names in os.walk(folder):
        out += [os.path.relpath(os.path.join(root, n), folder) for n in names]
    return sorted(out)


def write_json_atomic(path: str, obj, indent: Optional[int] = None) -> None:
    """``path`` replaced whole by ``obj`` as JSON: a temporary file beside it, fsync, rename."""
    write_atomic(path, json.dumps(obj, indent=indent))


def write_lines_atomic(path: str, lines: List[str]) -> None:
    write_atomic(path, "".join(lines))


def begin(output_dir: str, step: int) -> str:
    """A fresh temporary folder for the checkpoint of ``step`` (an old one from a killed save
    is removed); the caller writes into it, then calls :func:`commit`."""
    tmp = checkpoint_dir(output_dir, step) + TMP
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    return tmp


def commit(tmp: str, state: dict) -> str:
    """Write ``trainer_state.json`` (with the sizes of the other files) into ``tmp``, fsync
    everything, and rename ``tmp`` to its final name; returns that name."""
    final = tmp[:-len(TMP)]
    state = dict(state, files={f: os.path.getsize(os.path.join(tmp, f)) for f in _files(tmp)
                               if f != STATE})
    with open(os.path.join(tmp, STATE), "w") as f:
        json.dump(state, f)
    for f in _files(tmp):
        fsync_path(os.path.join(tmp, f))
    for root, dirs, _ in os.walk(tmp, topdown=False):
        for d in dirs:
            fsync_path(os.path.join(root, d), directory=True)
    fsync_path(tmp, directory=True)
    parent = os.path.dirname(os.path.abspath(final))
    if os.path.exists(final):
        # Never rewritten in place: the complete one steps aside, the new one takes its name,
        # and only then is the old one removed (a kill in between: see tidy()).
        old = final + OLD
        if os.path.exists(old):
            shutil.rmtree(old)
        os.rename(final, old)
        os.rename(tmp, final)
        fsync_path(parent, directory=True)
        shutil.rmtree(old)
    else:
        os.rename(tmp, final)
    fsync_path(parent, directory=True)
    return final


def tidy(output_dir: str) -> List[str]:
    """After a kill: remove unfinished ``.tmp`` checkpoints and half-deleted ``.del`` ones,
    and put back a complete checkpoint that a kill left stepped aside as ``.old``. Returns what
    it removed."""
    removed = []
    if not os.path.isdir(output_dir):
        return removed
    for name in sorted(os.listdir(output_dir)):
        path = os.path.join(output_dir, name)
        if not (name.startswith(PREFIX) and os.path.isdir(path)):
            continue
        if name.endswith(TMP) or name.endswith(DEL):
            shutil.rmtree(path)
            removed.append(name)
        elif name.endswith(OLD):
            final = path[:-len(OLD)]
            if os.path.exists(final):
                shutil.rmtree(path)
            else:
                os.rename(path, final)
    return removed


def read_state(folder: str) -> dict:
    """The trainer state of a complete checkpoint; ``CheckpointError`` (one line) otherwise."""
    where = os.path.join(folder, STATE)
    if not os.path.isdir(folder):
        raise CheckpointError(f"checkpoint {folder!r}: no such folder")
    try:
        with open(where) as f:
            st = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{where}: missing (the checkpoint is incomplete)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{where}: unreadable ({e})") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{where}: not valid JSON, torn or truncated ({e.msg} at "
                              f"char {e.pos})") from None
    if not isinstance(st, dict):
        raise CheckpointError(f"{where}: expected a JSON object")
    for k, t in _STATE_KEYS.items():
        if not isinstance(st.get(k), t) or isinstance(st.get(k), bool):
            raise CheckpointError(f"{where}: {k!r} missing or not a {t.__name__}")
    m = _NAME.match(os.path.basename(os.path.normpath(folder)))
    if m and int(m.group(1)) != st["global_step"]:
        raise CheckpointError(f"{where}: global_step {st['global_step']} in a folder for step "
                              f"{m.group(1)}")
    files = st.get("files")
    if files is not None:   # checkpoints written before the manifest existed have none
        for rel, size in files.items():
            p = os.path.join(folder, rel)
            if not os.path.isfile(p):
                raise CheckpointError(f"{p}: missing (the checkpoint is torn)")
            if os.path.getsize(p) != size:
                raise CheckpointError(f"{p}: {os.path.getsize(p)} bytes, {size} when saved "
                                      f"(truncated or rewritten)")
    return st


def candidates(output_dir: str) -> List[str]:
    """``checkpoint-<step>`` folders of ``output_dir``, newest first."""
    if not os.path.isdir(output_dir):
        return []
    steps = [(int(m.group(1)), name) for name in os.listdir(output_dir)
             if (m := _NAME.match(name)) and os.path.isdir(os.path.join(output_dir, name))]
    return [os.path.join(output_dir, name) for _, name in sorted(steps, reverse=True)]


def latest(output_dir: str) -> Tuple[List[Tuple[str, dict]], List[Tuple[str, str]]]:
    """The complete checkpoints of ``output_dir`` newest first, each with its state, and the
    torn ones (folder name, reason)."""
    good, torn = [], []
    for path in candidates(output_dir):
        try:
            good.append((path, read_state(path)))
        except CheckpointError as e:
            torn.append((os.path.basename(path), str(e)))
    return good, torn


def prune(output_dir: str, limit: int, protect: Sequence[Optional[str]] = ()) -> List[str]:
    """Keep the newest ``limit`` complete checkpoints of ``output_dir`` (``limit`` 0: keep
    all) and every folder in ``protect`` (the checkpoint being resumed from); remove the other
    complete ones and the torn ones older than the newest complete one, oldest first. Returns
    the names removed.

    Call it only after the newest checkpoint is committed: each removal renames the folder to
    ``.del`` (a kill leaves it complete or out of ``latest``'s sight) before deleting it, so at
    every moment the newest complete checkpoint is still there."""
    if limit <= 0:
        return []
    good, torn = latest(output_dir)
    if not good:    # nothing complete: a torn folder may be all there is to inspect
        return []
    keep = {os.path.realpath(p) for p, _ in good[:limit]}
    keep |= {os.path.realpath(p) for p in protect if p}
    newest = good[0][1]["global_step"]
    drop = [p for p, _ in good[limit:]]
    drop += [os.path.join(output_dir, name) for name, _ in torn
             if int(_NAME.match(name).group(1)) < newest]
    drop = [p for p in drop if os.path.realpath(p) not in keep]
    removed = []
    for path in sorted(drop, key=lambda p: int(_NAME.match(os.path.basename(p)).group(1))):
        gone = path + DEL
        try:
            if os.path.exists(gone):
                shutil.rmtree(gone)
            os.rename(path, gone)
            fsync_path(output_dir, directory=True)
            shutil.rmtree(gone)
        except OSError as e:
            # a checkpoint that cannot be deleted costs disk, not the run: one line, go on
            # (a half-deleted .del folder is retried by tidy() at the next start)
            print(f"checkpoint retention: could not remove {os.path.basename(path)} "
                  f"({getattr(e, 'strerror', None) or e}); remove "
                  f"{gone if os.path.exists(gone) else path} by hand",
                  file=sys.stderr)
            continue
        removed.append(os.path.basename(path))
    return removed


def describe_skipped(torn: List[Tuple[str, str]]) -> str:
    return "; ".join(f"{name} ({reason})" for name, reason in torn)
