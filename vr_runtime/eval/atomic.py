"""All-or-nothing writes of an evaluation's output files.

A run's files (``predictions.jsonl``, ``results.json``, ``.md``, ``.csv``, the plot) describe
one set of predictions, so they are replaced together: every file is first written in full to a
temporary file beside it (flushed and fsynced, so a crash or a full disk cannot leave a
half-written file under the real name), and only when all of them are complete are they renamed
over the old ones. If any write fails (``ENOSPC``, a quota, a read-only folder), the temporary
files are removed, the old files stay exactly as they were, and the error names the file.
"""
from __future__ import annotations

import contextlib
import os
import pathlib
from typing import Callable, Mapping, Union

# What a file is made of: its text, its bytes, or a function that writes it to the given path
# (e.g. matplotlib's savefig).
Content = Union[str, bytes, Callable[[pathlib.Path], None]]


def tmp_path(path: pathlib.Path) -> pathlib.Path:
    return path.with_name(path.name + ".tmp")


def _fsync_file(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: pathlib.Path) -> None:
    """Make the renames durable (POSIX; a no-op where a folder cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_one(tmp: pathlib.Path, content: Content) -> None:
    if callable(content):
        content(tmp)
        _fsync_file(tmp)
        return
    data = content.encode("utf-8") if isinstance(content, str) else content
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def write_files_atomically(files: Mapping[pathlib.Path, Content]) -> None:
    """Write every file of ``files`` or none of them (see the module doc). An ``OSError`` is
    re-raised with the file's final path as its ``filename``."""
    written = []
    path = None
    try:
        for path, content in files.items():
            path = pathlib.Path(path)
            tmp = tmp_path(path)
            written.append((tmp, path))
            _write_one(tmp, content)
    except BaseException as e:
        for tmp, _ in written:
            with contextlib.suppress(OSError):
                tmp.unlink()
        if isinstance(e, OSError):
            raise OSError(e.errno, f"{e.strerror or e}; nothing there was replaced (free space "
                          f"and rerun the same command: finished predictions are kept)",
                          str(path)) from e
        raise
    for tmp, path in written:
        os.replace(tmp, path)
    for folder in {p.parent for _, p in written}:
        _fsync_dir(folder)


__all__ = ["write_files_atomically", "tmp_path"]
