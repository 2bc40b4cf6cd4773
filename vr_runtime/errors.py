"""User-facing error types. Each is a ValueError/RuntimeError subclass whose message names the
problem and what to do; the command line prints it as one line and exits with status 2."""


class VideoError(ValueError):
    """Missing, empty, corrupt or non-video file; or a bad time window / frame count."""


class ModelFilesError(ValueError):
    """A model directory that is missing or lacks the files an InternVL3-*-hf checkpoint has."""


class RouterWeightsError(ValueError):
    """Router weights that are unreadable or do not fit the loaded model."""


class DeviceError(RuntimeError):
    """CUDA asked for but not available (or a dtype the device cannot run)."""


def did_you_mean(name, choices) -> str:
    """``"; did you mean 'fragment'?"`` for a near miss among ``choices`` (difflib's ratio),
    else ``""``: appended to "expected one of ..." messages of named choices."""
    import difflib
    close = difflib.get_close_matches(str(name), list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def expected_one_of(name, choices, word: str = "one") -> str:
    """``"expected one of a, b, c; did you mean 'b'?"``: the tail of every message that refuses
    ``name`` among named choices (policies, planners, scorers, eval methods)."""
    choices = list(choices)
    return f"expected {word} of {', '.join(choices)}{did_you_mean(name, choices)}"
