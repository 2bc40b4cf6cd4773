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


def counting_answers(monkeypatch):
    """Record every question the evaluator answers -> the list of (question id, method,
    budget), filled as the run goes."""
    from vr_runtime.eval import runner
    calls = []
    real = runner.Evaluator.predict

    def counting(self, clip, q, m, b, F):
        calls.append((q.id, m.name, b))
        return real(self, clip, q, m, b, F)

    monkeypatch.setattr(runner.Evaluator, "predict", counting)
    return calls


def failing_decode(bad_name: str):
    """A ``vr_runtime.video.stream.decode_frames`` that fails part-way for the file
    ``bad_name`` (the cheap checks pass, decoding its frames raises) and decodes every other
    file (patch it with ``monkeypatch.setattr(stream, "decode_frames", ...)``)."""
    import pathlib

    from vr_runtime.video import stream
    real = stream.decode_frames

    def decode(info, *a, **kw):
        if pathlib.Path(info.path).name == bad_name:
            raise RuntimeError("decoder crashed at frame 7")
        return real(info, *a, **kw)
    return decode
