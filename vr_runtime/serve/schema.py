"""The request and response shapes of ``POST /v1/chat/completions`` (OpenAI's chat schema, with
vLLM's extensions for video: ``video_url`` content parts, ``mm_processor_kwargs``,
``media_io_kwargs``).

:class:`ChatRequest` checks types strictly (``"16"`` is not a frame count, ``true`` is not an
int): a wrong type is a 400, as is a missing field. Fields this server does not use are ignored,
as vLLM ignores them; options it cannot honour (``n`` > 1, ``stop``, ``logprobs``, ``tools``,
images) are refused with a 400 that names them rather than silently dropped.
:func:`to_settings` turns a valid request into the :class:`Settings` of one ``VideoRouter.answer``
call; :func:`completion` and :func:`chunk` build the answers.
"""
from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError
from typing_extensions import Annotated

from ..errors import did_you_mean
from ..planning.scales import ScalesError, parse_scales
from ..video.sampling import MIN_FRAMES, NUM_FRAMES, Sampling
from .errors import APIError

# The per-request settings a client may give at the top level or under mm_processor_kwargs
# (docs/CONTRACT.md section 6); media_io_kwargs {"video": {"num_frames": N}} is what lmms-eval's `openai`
# model sends with pass_video_url=True (vLLM's spelling for the frames its video loader samples).
SETTINGS = ("num_frames", "fps", "max_length", "policy", "scales", "seek", "time_window")


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class VideoURL(_Strict):
    url: str


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class VideoPart(_Strict):
    type: Literal["video_url"]
    video_url: Union[VideoURL, str]   # vLLM also takes the bare string


class OtherPart(BaseModel):
    """Any other content part (image_url, input_audio...): parsed only to be refused by name."""
    model_config = ConfigDict(extra="allow")
    type: str


def _part_kind(v) -> str:
    t = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    return t if t in ("text", "video_url") else "other"


Part = Annotated[Union[Annotated[TextPart, Tag("text")], Annotated[VideoPart, Tag("video_url")],
                       Annotated[OtherPart, Tag("other")]], Discriminator(_part_kind)]


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, List[Part], None] = None


class StreamOptions(_Strict):
    include_usage: bool = False


class ChatRequest(_Strict):
    messages: List[Message] = Field(min_length=1)
    model: Optional[str] = None
    max_tokens: Optional[int] = Field(default=None, ge=1)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    n: Optional[int] = 1
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    # Decoding is greedy, as in `videorouter ask`: sampling settings are accepted (clients send
    # them by default) and have no effect; README says so.
    temperature: Optional[float] = Field(default=None, ge=0, le=2)
    top_p: Optional[float] = Field(default=None, ge=0, le=1)
    seed: Optional[int] = None
    stop: Union[str, List[str], None] = None
    logprobs: Optional[bool] = False
    tools: Optional[List[Any]] = None
    num_frames: Optional[int] = None
    fps: Union[float, int, None] = None            # sample by rate (Qwen's fps), up to max_frames
    max_length: Optional[int] = None
    policy: Optional[str] = None
    scales: Union[str, List[Any], None] = None    # "2,1,4" / [2, 1, 4] / "auto" (vr_runtime.planning.scales)
    seek: Optional[str] = None                     # "exact" (default) or "keyframe"
    time_window: Union[List[Any], str, None] = None   # [start_s, end_s] or "START,END"
    mm_processor_kwargs: Optional[Dict[str, Any]] = None
    media_io_kwargs: Optional[Dict[str, Any]] = None
    # Beyond OpenAI's schema, opt-in: the answer carries a JPEG thumbnail of each sampled frame,
    # made from the frames the request decodes (docs/serving.md; what /ui asks for).
    videorouter_thumbnails: Optional[bool] = None


@dataclass(frozen=True)
class Settings:
    """One ``VideoRouter.answer`` call (the video still as the client's URL)."""
    video_url: str
    question: str
    system: Optional[str]
    num_frames: int
    max_length: int
    max_new_tokens: int
    policy: str
    stream: bool
    include_usage: bool
    scales: Any = (2, 1, 4)      # (s_g, s_1, s_0) or "auto"
    seek: str = "exact"          # "exact" or "keyframe" (vr_runtime.video.decoders.SEEKS)
    time_window: Optional[tuple] = None   # (start_s, end_s): sample only this part
    fps: Optional[float] = None  # sample by rate: fps frames a second, up to num_frames
    # Where the request's decoded frames leave their thumbnails (a ThumbnailSink, set by the app
    # when the request asks for them); not a setting of the answer, so batches ignore it.
    thumbnails: Any = field(default=None, compare=False)

    @property
    def sampling(self) -> Sampling:
        """The frames this request reads; by rate, between Qwen's fewest (fewer when
        ``num_frames`` is) and ``num_frames``."""
        return Sampling(self.num_frames, self.time_window, self.fps,
                        min(MIN_FRAMES, self.num_frames), self.num_frames, seek=self.seek)


@dataclass(frozen=True)
class Limits:
    """The server's defaults (those of ``videorouter ask``) and caps."""
    num_frames: int = NUM_FRAMES
    max_length: int = 12288
    max_new_tokens: int = 64
    policy: str = "auto"
    scales: Any = (2, 1, 4)      # --scales: a request that gives none gets these
    max_frames: int = 256
    max_new_tokens_limit: int = 4096
    # The prompt's text (question + system), capped before any tokenizing: by characters here
    # (to_settings), then by tokens off the model's lock (Engine). None: derived from max_length.
    max_prompt_chars: Optional[int] = None
    max_prompt_tokens: Optional[int] = None

    def __post_init__(self):
        if self.max_prompt_tokens is None:
            # The text alone can never use more than the whole context.
            object.__setattr__(self, "max_prompt_tokens", self.max_length)
        if self.max_prompt_chars is None:
            object.__setattr__(self, "max_prompt_chars",
                               PROMPT_CHARS_PER_TOKEN * self.max_prompt_tokens)


# Characters allowed per prompt token by the default character cap: English text averages about
# 4 per token, so the cap only bites where the token cap would; it bounds the tokenizer's work
# (about 50 ms for the default 196,608 characters on one CPU core).
PROMPT_CHARS_PER_TOKEN = 16


def parse_request(data: Any) -> ChatRequest:
    if not isinstance(data, dict):
        raise APIError(400, f"the request body must be a JSON object, got {_json_type(data)}")
    try:
        return ChatRequest.model_validate(data)
    except ValidationError as e:
        raise APIError(400, _validation_message(e), _first_loc(e)) from None


def _json_type(v) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(v), "a number")


_MEMBER_LABELS = {"str", "int", "float", "bool", "none", "dict", "list"}


def _loc(err) -> str:
    """The path the client wrote (``messages.0.content.1.text``). Pydantic adds union-member
    labels to it (``str``, ``VideoURL``, ``list[...]``, and the tag of a tagged union after the
    list index), which are dropped."""
    parts, tag_in = [], -1
    for p in err.get("loc", ()):
        if tag_in == 0:          # the tag of a tagged-union member
            tag_in = -1
            continue
        if tag_in > 0:
            tag_in -= 1
        if isinstance(p, int):
            parts.append(str(p))
            continue
        if "[" in p:
            if "tagged-union[" in p:
                tag_in = 1 if p.startswith("list[") else 0
            continue
        if p in _MEMBER_LABELS or p[:1].isupper():
            continue
        parts.append(p)
    return ".".join(parts)


def _field_errors(e: ValidationError) -> Dict[str, str]:
    """One message per field. A union reports a complaint per member at different depths (a
    string was expected at ``content``, a field is missing at ``content.0.text``): the deepest
    is the one the client meant, so a path that is a prefix of another is dropped."""
    by_field: Dict[str, str] = {}
    for err in e.errors():
        loc = _loc(err) or "body"
        msg = "required field is missing" if err.get("type") == "missing" else err.get("msg", "")
        by_field.setdefault(loc, msg)
    return {loc: msg for loc, msg in by_field.items()
            if not any(o != loc and o.startswith(loc + ".") for o in by_field)}


def _first_loc(e: ValidationError) -> Optional[str]:
    fields = [f for f in _field_errors(e) if f != "body"]
    return fields[0] if fields else None


def _validation_message(e: ValidationError) -> str:
    items = [f"{loc}: {msg}" for loc, msg in _field_errors(e).items()]
    more = f" (and {len(items) - 3} more)" if len(items) > 3 else ""
    return "invalid request: " + "; ".join(items[:3]) + more


def _int_setting(name: str, v, lo: int, hi: Optional[int] = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise APIError(400, f"{name}: expected an integer, got {v!r}", name)
    if v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise APIError(400, f"{name}: expected an integer {rng}, got {v}", name)
    return v


def _merged_setting(req: ChatRequest, name: str):
    """A setting from the top level, mm_processor_kwargs or (frames) media_io_kwargs; the same
    setting given twice with different values is a 400 rather than a silent choice."""
    found = []
    top = getattr(req, name)
    if top is not None:
        found.append((name, top))
    mm = req.mm_processor_kwargs or {}
    if mm.get(name) is not None:
        found.append((f"mm_processor_kwargs.{name}", mm[name]))
    if name == "num_frames":
        video = (req.media_io_kwargs or {}).get("video")
        if isinstance(video, dict) and video.get("num_frames") is not None:
            found.append(("media_io_kwargs.video.num_frames", video["num_frames"]))
    if not found:
        return None, name
    where, value = found[0]
    for w, v in found[1:]:
        if v != value or type(v) is not type(value):
            raise APIError(400, f"{name} is given twice with different values ({where}={value!r}, "
                           f"{w}={v!r}); give it once", name)
    return value, where


def _text(content, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    out = []
    for i, part in enumerate(content):
        if isinstance(part, TextPart):
            out.append(part.text)
        else:
            raise APIError(400, f"{where}.content.{i}: a {part.type!r} part is not supported "
                           f"here; only text", f"{where}.content")
    return "\n".join(out)


def to_settings(req: ChatRequest, limits: Limits, model_names) -> Settings:
    """The checked settings of one request (400/404 on anything this server cannot honour).
    The checks run in a fixed order (model and unsupported options, messages, then each
    setting), so a request with several faults always gets the same error."""
    _refuse_unsupported(req, model_names)
    video_url, question, system = _conversation(req, limits)
    frames, max_length = _frames_setting(req, limits), _max_length_setting(req, limits)
    policy, scales = _policy_setting(req, limits), _scales_setting(req, limits)
    new_tokens = _max_tokens_setting(req, limits)
    seek, window, fps = _seek_setting(req), _time_window_setting(req), _fps_setting(req)
    if fps is not None and _merged_setting(req, "num_frames")[0] is None:
        frames = limits.max_frames   # by rate, up to the server's cap (or num_frames if given)
    return Settings(video_url, question, system, frames, max_length, new_tokens, policy,
                    bool(req.stream),
                    bool(req.stream_options and req.stream_options.include_usage), scales,
                    seek, window, fps)


def _refuse_unsupported(req: ChatRequest, model_names) -> None:
    """404 for a model this server does not serve; 400 for options it cannot honour."""
    if req.model is not None and req.model not in model_names:
        raise APIError(404, f"the model {req.model!r} does not exist; this server serves "
                       f"{', '.join(repr(m) for m in model_names)} (GET /v1/models)", "model")
    if req.n not in (None, 1):
        raise APIError(400, f"n: only n=1 is supported (decoding is greedy), got {req.n}", "n")
    if req.stop:
        raise APIError(400, "stop: stop sequences are not supported; the answer ends at the "
                       "model's end-of-turn token or max_tokens", "stop")
    if req.logprobs:
        raise APIError(400, "logprobs: not supported", "logprobs")
    if req.tools:
        raise APIError(400, "tools: tool calls are not supported", "tools")
    extra = req.media_io_kwargs
    if extra is not None and "video" in extra and not isinstance(extra["video"], dict):
        raise APIError(400, "media_io_kwargs.video: expected an object", "media_io_kwargs")


def _message_parts(req: ChatRequest):
    """(system texts, user texts, video URLs) of the messages: system and developer messages
    are text; the one user message is text and content parts (text, video_url)."""
    system_parts, user_parts, video_urls = [], [], []
    for i, m in enumerate(req.messages):
        where = f"messages.{i}"
        if m.role in ("system", "developer"):
            system_parts.append(_text(m.content, where))
            continue
        if m.role != "user":
            raise APIError(400, f"{where}: role {m.role!r}: multi-turn conversations are not "
                           f"supported; send one user message with the video and the question "
                           f"(a system message may come first)", "messages")
        if isinstance(m.content, str) or m.content is None:
            user_parts.append(m.content or "")
            continue
        for j, part in enumerate(m.content):
            if isinstance(part, TextPart):
                user_parts.append(part.text)
            elif isinstance(part, VideoPart):
                url = part.video_url.url if isinstance(part.video_url, VideoURL) else part.video_url
                video_urls.append(url)
            else:
                raise APIError(400, f"{where}.content.{j}: content parts of type {part.type!r} "
                               f"are not supported; send text and one video_url", "messages")
    return system_parts, user_parts, video_urls


def _conversation(req: ChatRequest, limits: Limits):
    """(video URL, question, system text or None): one user message with one video and a
    non-empty question, the prompt's text within ``limits.max_prompt_chars``."""
    system_parts, user_parts, video_urls = _message_parts(req)
    if sum(1 for m in req.messages if m.role == "user") != 1:
        raise APIError(400, "messages: expected exactly one user message (with the video and the "
                       "question)", "messages")
    if not video_urls:
        raise APIError(400, "messages: no video; add a content part {\"type\": \"video_url\", "
                       "\"video_url\": {\"url\": \"file:///...\" or \"data:video/mp4;base64,...\"}}",
                       "messages")
    if len(video_urls) > 1:
        raise APIError(400, f"messages: {len(video_urls)} videos; send exactly one video_url "
                       f"per request", "messages")
    n_chars = sum(len(p or "") for p in user_parts) + sum(len(p) for p in system_parts)
    if n_chars > limits.max_prompt_chars:
        raise APIError(400, f"the prompt (question and system text) is {n_chars} characters, over "
                       f"the server's limit of {limits.max_prompt_chars} (--max-prompt-chars); "
                       f"shorten it", "messages")
    question = "\n".join(p for p in user_parts if p)
    if not question.strip():
        raise APIError(400, "messages: the question is empty; add a text part that asks "
                       "something about the video", "messages")
    return video_urls[0], question, "\n".join(p for p in system_parts if p) or None


def _frames_setting(req: ChatRequest, limits: Limits) -> int:
    frames, where = _merged_setting(req, "num_frames")
    return limits.num_frames if frames is None else _int_setting(where, frames, 1,
                                                                 limits.max_frames)


def _fps_setting(req: ChatRequest) -> Optional[float]:
    fps, where = _merged_setting(req, "fps")
    if fps is None:
        return None
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 0 < fps < float("inf"):
        raise APIError(400, f"{where}: expected frames a second > 0 (e.g. 2), got {fps!r}",
                       where)
    return float(fps)


def _max_length_setting(req: ChatRequest, limits: Limits) -> int:
    max_length, where = _merged_setting(req, "max_length")
    return limits.max_length if max_length is None else _int_setting(where, max_length, 1)


def _policy_setting(req: ChatRequest, limits: Limits) -> str:
    # (imported here: the policies pull in torch, and the serve command reads Limits from this
    # module while it checks its arguments)
    from ..planning.policies import policy_names
    policy, where = _merged_setting(req, "policy")
    if policy is None:
        return limits.policy
    if not isinstance(policy, str) or policy not in policy_names():
        raise APIError(400, f"{where}: expected one of {', '.join(policy_names())}, got "
                       f"{policy!r}{did_you_mean(policy, policy_names())}", where)
    return policy


def _scales_setting(req: ChatRequest, limits: Limits):
    scales, where = _merged_setting(req, "scales")
    if scales is None:
        return limits.scales
    try:
        return parse_scales(scales, where)
    except ScalesError as e:
        raise APIError(400, str(e), where) from None


def _max_tokens_setting(req: ChatRequest, limits: Limits) -> int:
    if req.max_tokens is not None and req.max_completion_tokens is not None \
            and req.max_tokens != req.max_completion_tokens:
        raise APIError(400, "max_tokens and max_completion_tokens differ; give one of them",
                       "max_completion_tokens")
    new_tokens = req.max_completion_tokens or req.max_tokens or limits.max_new_tokens
    return _int_setting("max_tokens", new_tokens, 1, limits.max_new_tokens_limit)


def _seek_setting(req: ChatRequest) -> str:
    seek, where = _merged_setting(req, "seek")
    if seek is None:
        return "exact"
    if seek not in ("exact", "keyframe"):
        raise APIError(400, f"{where}: expected exact or keyframe, got {seek!r}", where)
    return seek


def _time_window_setting(req: ChatRequest) -> Optional[tuple]:
    window, where = _merged_setting(req, "time_window")
    return None if window is None else _time_window(window, where)


def _time_window(v, where: str) -> tuple:
    """[start_s, end_s] or "START,END" seconds: finite, 0 <= start < end (whether the window
    lies inside the video is checked when the video is opened)."""
    items = v.split(",") if isinstance(v, str) else v
    try:
        if isinstance(items, (list, tuple)) and len(items) == 2 and not any(
                isinstance(x, bool) for x in items):
            start, end = (float(x) for x in items)
            if math.isfinite(start) and math.isfinite(end) and 0 <= start < end:
                return (start, end)
    except (TypeError, ValueError):
        pass
    raise APIError(400, f"{where}: expected [start_s, end_s] (or \"START,END\") in seconds "
                   f"with 0 <= start < end, got {v!r}", where)


# ----------------------------------------------------------------------------- responses

def new_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def usage(report: dict) -> dict:
    p, c = int(report.get("prompt_tokens") or 0), int(report.get("generated_tokens") or 0)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def finish_reason(report: dict, max_new_tokens: int) -> str:
    # The runtime stops at an end-of-turn id (excluded from the count) or at max_new_tokens.
    return "length" if int(report.get("generated_tokens") or 0) >= max_new_tokens else "stop"


def completion(cid: str, model: str, text: str, report: dict, max_new_tokens: int) -> dict:
    """A ``chat.completion`` object plus ``videorouter``: the ``ask --json`` report."""
    return {
        "id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "logprobs": None, "finish_reason": finish_reason(report, max_new_tokens)}],
        "usage": usage(report),
        "videorouter": report,
    }


def chunk(cid: str, created: int, model: str, delta: Optional[dict], finish: Optional[str] = None,
          **extra) -> dict:
    """A ``chat.completion.chunk`` (``delta`` None: a usage-only chunk with no choices)."""
    choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None,
                                         "finish_reason": finish}]
    out = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
           "choices": choices}
    out.update(extra)
    return out
