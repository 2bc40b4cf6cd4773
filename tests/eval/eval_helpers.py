"""Helpers of the evaluation tests (a plain module, not conftest: `from conftest import ...`
resolves to whichever conftest.py pytest imported first when test folders run together)."""


def run_cli(argv, capsys):
    """``videorouter eval ARGV`` in-process -> (status, stdout, stderr)."""
    from vr_runtime.cli import main
    try:
        status = main(["eval"] + [str(a) for a in argv])
    except SystemExit as e:
        status = e.code
    out, err = capsys.readouterr()
    return status, out, err
