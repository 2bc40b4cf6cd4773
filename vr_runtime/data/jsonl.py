"""JSON-lines files (one JSON value a line), as training data, labels and results use them.

Reading skips blank lines and names ``path:line`` in every error, so that a bad line in a file
of thousands can be found; the caller chooses the error type (training raises its
``DataFormatError``, a subclass of :class:`JsonlError`). Writing creates the folder; with
``atomic=True`` the file is replaced whole (:func:`vr_runtime.data.atomic.write_atomic`), so a
killed run never leaves a file cut short under the real name.
"""
from __future__ import annotations

import json
import os
from typing import Iterable, Iterator, Tuple, Type

from .atomic import write_atomic


class JsonlError(ValueError):
    """A JSON-lines file that does not exist, or a line of it that is not JSON."""


def iter_jsonl(path: str, what: str = "data",
               error: Type[Exception] = JsonlError) -> Iterator[Tuple[str, object]]:
    """Yield ``(where, record)`` for each non-blank line of a JSONL file, ``where`` being
    ``path:line`` for error messages; a missing file (``what`` names the kind of file) or a
    line that is not JSON raises ``error``."""
    if not os.path.isfile(path):
        raise error(f"{path}: no such {what} file")
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise error(f"{where}: not valid JSON ({e.msg} at column {e.colno})")
            yield where, rec


def dumps_lines(records: Iterable[object]) -> str:
    """The text of a JSONL file: one ``json.dumps`` a line, each ending in a newline."""
    return "".join(json.dumps(r) + "\n" for r in records)


def write_jsonl(path, records: Iterable[object], atomic: bool = False) -> None:
    """Write ``records`` one a line to ``path`` (its folder created); ``atomic``: all at once
    through a temporary file, so nothing is ever half-written."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if atomic:
        write_atomic(path, dumps_lines(records))
        return
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


__all__ = ["JsonlError", "iter_jsonl", "write_jsonl", "dumps_lines"]
