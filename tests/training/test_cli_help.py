"""`python -m vr_runtime.training --help`: its examples are printed as they are typed."""
import re

import pytest

from vr_runtime.training.__main__ import main


def help_text(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def test_help_examples_keep_their_line_continuations(capsys):
    """A lone backslash at the end of a docstring line joined it with the next one
    ('--out flr.jsonl         [--model tiny]')."""
    lines = help_text(capsys).splitlines()
    examples = [i for i, line in enumerate(lines) if "python -m vr_runtime.training " in line]
    assert len(examples) >= 10
    for i, line in enumerate(lines):
        assert not re.search(r"\S {4,}(\[|--)", line), line           # no joined line
        if line.endswith("\\"):
            assert not line.endswith("\\\\"), line
            # the continued line is indented under its example (examples start at 4)
            assert len(lines[i + 1]) - len(lines[i + 1].lstrip()) > 4, lines[i + 1]
    assert "issue 8" not in "\n".join(lines)
