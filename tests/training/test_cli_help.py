"""`python -m vr_runtime.training --help` and `python -m vr_tiny --help`: their examples are
printed as they are typed."""
import re

import pytest

from vr_runtime.training.__main__ import main
from vr_tiny.__main__ import main as tiny_main


def help_text(capsys, run):
    with pytest.raises(SystemExit) as e:
        run(["--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("run,prog,n", [(main, "python -m vr_runtime.training ", 4),
                                        (tiny_main, "python -m vr_tiny ", 8)])
def test_help_examples_keep_their_line_continuations(capsys, run, prog, n):
    """A lone backslash at the end of a docstring line joined it with the next one
    ('--out flr.jsonl         [--model tiny]')."""
    lines = help_text(capsys, run).splitlines()
    examples = [i for i, line in enumerate(lines) if prog in line]
    assert len(examples) >= n
    for i, line in enumerate(lines):
        assert not re.search(r"\S {4,}(\[|--)", line), line           # no joined line
        if line.endswith("\\"):
            assert not line.endswith("\\\\"), line
            # the continued line is indented under its example (examples start at 4)
            assert len(lines[i + 1]) - len(lines[i + 1].lstrip()) > 4, lines[i + 1]
    assert "issue 8" not in "\n".join(lines)
