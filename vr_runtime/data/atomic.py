"""All-or-nothing file writes, shared by eval's results, training's checkpoints and logs, and
the benchmarks' results files.

Files that describe one thing (an evaluation's ``predictions.jsonl``, ``results.json``, ``.md``,
``.csv`` and plot) are replaced together: every file is first written in full to a temporary
file beside it (flushed and fsynced, so a crash or a full disk cannot leave a half-written file
under the real name), and only when all of them are complete are they renamed over the old ones.
If any write fails (``ENOSPC``, a quota, a read-only folder), the temporary files are removed,
the old files stay exactly as they were, and the error names the file.
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


def fsync_path(path, directory: bool = False) -> None:
    """fsync a file, or a folder (which makes the renames in it durable). A folder that cannot be
    opened or synced (some platforms) is skipped; a file's failure is raised."""
    try:
        fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    except OSError:
        if directory:
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not directory:
            raise
    finally:
        os.close(fd)


def _write_one(tmp: pathlib.Path, content: Content) -> None:
    if callable(content):
        content(tmp)
        fsync_path(tmp)
        return
    data = content.encode("utf-8") if isinstance(content, str) else content
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def write_files_atomically(files: Mapping[pathlib.Path, Content],
                           hint: str = "nothing there was replaced") -> None:
    """Write every file of ``files`` or none of them (see the module doc). An ``OSError`` is
    re-raised with the file's final path as its ``filename`` and ``hint`` (what the caller's
    user should know) after its message."""
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
            raise OSError(e.errno, f"{e.strerror or e}; {hint}", str(path)) from e
        raise
    for tmp, path in written:
        os.replace(tmp, path)
    for folder in {p.parent for _, p in written}:
        fsync_path(folder, directory=True)


def write_atomic(path, content: Content) -> None:
    """One file replaced whole (temporary file, fsync, rename, folder fsync)."""
    write_files_atomically({pathlib.Path(path): content})


__all__ = ["write_files_atomically", "write_atomic", "fsync_path", "tmp_path"]
