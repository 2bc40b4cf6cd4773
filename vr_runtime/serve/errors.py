"""OpenAI-style error objects for the server, and the one mapping from an exception to one.

Every error leaves the server as ``{"error": {"message", "type", "param", "code"}}`` with the HTTP
status in ``code`` and an OpenAI/vLLM type name (``BadRequestError`` ...), as vLLM's OpenAI server
answers. Messages are one line. Exceptions from the runtime get the same text the command line
prints after ``videorouter: error:`` (``vr_runtime.cli``'s own helpers make it), so a video that
``videorouter ask`` refuses is refused here with the same words.
"""
from __future__ import annotations

import hmac
from typing import Optional

from ..cli_io import message as cli_message, one_line, user_errors
from ..errors import VideoError

# HTTP status -> error type, named as the ``openai`` client's exception classes (and vLLM) name them.
ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestTooLargeError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    499: "ClientClosedRequest",     # nginx's code: the client left; nobody reads this answer
    500: "InternalServerError",
    503: "ServiceUnavailableError",
    504: "TimeoutError",
}


class APIError(Exception):
    """An error answer: HTTP ``status`` and a one-line ``message`` (``param``: the field at fault)."""

    def __init__(self, status: int, message: str, param: Optional[str] = None,
                 headers: Optional[dict] = None):
        super().__init__(message)
        self.status = int(status)
        self.message = one_line(message)
        self.param = param
        self.headers = dict(headers or {})   # e.g. Retry-After on 429 and 503

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param)


class Skipped(APIError):
    """A job that never ran: its request was given up (deadline, client gone, drain)."""


def error_body(status: int, message: str, param: Optional[str] = None) -> dict:
    return {"error": {"message": one_line(message), "type": ERROR_TYPES.get(status, "Error"),
                      "param": param, "code": int(status)}}


def _oom_types() -> tuple:
    try:
        import torch   # (here: torch stays out of the serve command's start-up)
        oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError")
        return (oom,)
    except Exception:  # pragma: no cover
        return ()


def from_exception(e: BaseException, replace: Optional[dict] = None) -> APIError:
    """The answer for an exception raised while answering a request.

    VideoError -> 422 (the video cannot be used); other ValueErrors (BudgetError, a setting the
    runtime refuses) -> 400; out of memory -> 503 (this request only; the server keeps serving);
    anything else -> 500 with the CLI's "internal error" line. ``replace`` maps server-side text
    (the path of a stored ``data:`` upload) to what the client sent."""
    if isinstance(e, APIError):
        return e
    text = cli_message(e)
    for old, new in (replace or {}).items():
        text = text.replace(old, new)
    if isinstance(e, VideoError):
        return APIError(422, text)
    if isinstance(e, _oom_types()):
        return APIError(503, f"out of memory while answering this request: {text}")
    if isinstance(e, ValueError):
        return APIError(400, text)
    if isinstance(e, user_errors()):
        return APIError(500, text)
    return APIError(500, f"internal error: {type(e).__name__}: {text}")


def key_error(auth: str, api_key: str) -> None:
    """Raise the 401 unless ``auth`` (the Authorization header) carries ``api_key``."""
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                             api_key.encode()):
        raise APIError(401, "missing or wrong API key; send 'Authorization: Bearer <key>'")
