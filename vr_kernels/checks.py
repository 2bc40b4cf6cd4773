"""Host-side validation of ``pool_pack`` arguments (docs/CONTRACT.md section 1), done before any launch.

Every backend (Triton, vectorised torch, reference) goes through :func:`check_args`, so a bad
argument gives the same ``PoolPackArgError`` (a ``ValueError``) naming the argument whatever
runs afterwards. The result, :class:`LaunchPlan` (what one call launches: frames, windows,
counts, destination rows; not a routing policy's plan), is plain Python ints plus the
:class:`Schedule` it came from; the backends build (and cache) their index tables from the
schedule.

Host cost matters here: ``pool_pack`` runs once per request with T up to ~1024 frames, and a
per-frame Python loop (~0.7 us a frame) would cost more than the kernel. So:

* the per-frame work is done by C-level passes (``set(map(type, ...))``, ``tuple``, numpy), not
  a Python loop; the loop survives only as the *slow path* that runs when a fast check fails
  (it finds the offending entry and names it) or for unusual element types (numpy scalars);
* a validated schedule (the windows) and a validated ``dest`` (for one schedule and ``L``) are
  cached, keyed on their exact contents. Keys are only looked up after the element-type check,
  because ``True == 1`` and ``1.0 == 1`` hash alike: a cached ``[1, 1]`` must not accept
  ``[True, 1]`` or ``[1.0, 1]``.
"""
from __future__ import annotations

from itertools import chain, count
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from .windows import _cdiv, _check_grid, normalize_window

#: dtypes the Triton kernels handle (fp32 accumulation, one rounding to the output dtype).
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: the PyTorch paths also take float64, which ``gradcheck`` needs.
TORCH_DTYPES = KERNEL_DTYPES + (torch.float64,)

_CACHE_SIZE = 256
_INT = frozenset((int,))
_INT_TUPLE = frozenset((int, tuple))


class PoolPackArgError(ValueError):
    """A bad argument to ``pool_pack``; the message names the argument and what to do."""


class Schedule:
    """One validated sequence of windows on one grid: what decides the tile tables.

    ``key`` identifies it in the tile cache (``tiles.py``); the numpy arrays are what the
    table builders vectorise over; ``starts`` are the packed (no ``out``) first rows."""

    __slots__ = ("key", "uid", "grid", "windows", "counts", "sh", "sw", "cnt", "total", "starts", "_tensors")
    _uids = count()

    def __init__(self, key, grid, windows, counts, sh=None, sw=None, cnt=None):
        self.key = key
        self.uid = next(Schedule._uids)  # a cheap identity for keys that involve the schedule
        self.grid = grid
        self.windows = windows
        self.counts = counts
        T = len(windows)
        if sh is None:
            sh = np.fromiter((0 if w is None else w[0] for w in windows), np.int64, T)
            sw = np.fromiter((0 if w is None else w[1] for w in windows), np.int64, T)
            cnt = np.fromiter(counts, np.int64, T)
        self.sh, self.sw, self.cnt = sh, sw, cnt
        self.total = int(cnt.sum())
        ex = np.zeros(T, np.int64)
        if T:
            np.cumsum(self.cnt[:-1], out=ex[1:])
        self.starts = tuple(ex.tolist())
        self._tensors = {}  # per-backend derived tensors (tile tables, gather indices)

    def derived(self, name, build):
        """A per-schedule cached derived object (``build()`` runs once per name)."""
        v = self._tensors.get(name)
        if v is None:
            v = self._tensors[name] = build()
        return v


class DestEntry:
    """A validated ``dest`` for one schedule and ``out`` size: the per-frame first rows (0 for
    dropped frames) and the tensors derived from them (cached with it)."""

    __slots__ = ("dest", "_tensors")

    def __init__(self, dest: tuple):
        self.dest = dest
        self._tensors = {}

    derived = Schedule.derived


class LaunchPlan:
    """One ``pool_pack`` call's normalised arguments: one entry per frame (``None`` window =
    dropped). Not a routing policy's plan (the per-frame windows the planner picks): this is
    what the backends launch for one call, including where each frame's rows go.

    A plain slotted class, not a dataclass: it is built on every call, and a frozen
    dataclass's ``__init__`` costs microseconds the host path does not have."""

    __slots__ = ("T", "N", "D", "grid", "windows", "counts", "dest", "rows", "schedule", "dest_entry")

    def __init__(self, T: int, N: int, D: int, grid: Tuple[int, int],
                 windows: Tuple[Optional[Tuple[int, int]], ...], counts: Tuple[int, ...],
                 dest: Tuple[int, ...], rows: int, schedule: Optional[Schedule] = None,
                 dest_entry: Optional[DestEntry] = None):
        self.T, self.N, self.D, self.grid = T, N, D, grid
        self.windows = windows      # one per frame, None = dropped
        self.counts = counts        # output rows per frame (0 when dropped)
        self.dest = dest            # first output row per frame (dropped frames: 0, unused)
        self.rows = rows            # rows of the result (sum(counts), or out.shape[0])
        self.schedule = schedule    # the validated schedule (None for a plan made by hand)
        self.dest_entry = dest_entry  # the validated dest (None: packed output)

    @property
    def total(self) -> int:
        return sum(self.counts)

    def sched(self) -> Schedule:
        """The plan's schedule (built here for a plan made by hand, as tests do)."""
        if self.schedule is None:
            self.schedule = Schedule(("plan", self.windows, self.grid), self.grid, self.windows, self.counts)
        return self.schedule


def _as_list(x, name: str) -> list:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().tolist()
    if hasattr(x, "tolist") and not isinstance(x, (list, tuple)):  # numpy arrays
        return x.tolist()
    if isinstance(x, (list, tuple)):
        return list(x)
    raise PoolPackArgError(f"{name}: expected a sequence (list, tuple, 1-D tensor), got {type(x).__name__}")


def _as_int(v, name: str) -> int:
    if hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, int):
        raise PoolPackArgError(f"{name}: expected an int, got {v!r}")
    return v


# Plain dicts, oldest entry evicted first. No LRU bookkeeping on a hit: move_to_end would hash
# a T-long key once more (~10 us at T=1024), for little gain with room for 256 schedules.
_SCHEDULES: "dict[tuple, Schedule]" = {}
_DESTS: "dict[tuple, DestEntry]" = {}


def _remember(cache: dict, key, value):
    if len(cache) >= _CACHE_SIZE:
        del cache[next(iter(cache))]
    cache[key] = value
    return value


def _fast_windows(seq: tuple, H: int, W: int):
    """Windows and counts of an int/pair schedule with numpy, or None to take the slow path
    (a negative window, a malformed pair: the slow path names the entry)."""
    T = len(seq)
    pairs = [s for s in seq if type(s) is tuple]
    if pairs:
        if set(map(len, pairs)) != {2} or set(map(type, chain.from_iterable(pairs))) != _INT:
            return None
        if min(chain.from_iterable(pairs)) < 1:
            return None
        sh = np.fromiter((s if type(s) is int else s[0] for s in seq), np.int64, T)
        sw = np.fromiter((s if type(s) is int else s[1] for s in seq), np.int64, T)
    else:
        sh = np.fromiter(seq, np.int64, T)
        sw = sh
    if T and int(sh.min()) < 0:
        return None
    shc, swc = np.maximum(sh, 1), np.maximum(sw, 1)
    cnt = (-(-H // shc) * -(-W // swc)) * (sh > 0)
    # One normalised tuple per distinct window, shared by every frame using it.
    norm = {0: None}
    for s in set(seq):
        if s != 0:
            norm[s] = (s, s) if type(s) is int else s
    windows = tuple(map(norm.__getitem__, seq))
    return windows, tuple(cnt.tolist()), sh * (sh > 0), sw * (sh > 0), cnt


def _slow_windows(windows: list, H: int, W: int):
    norm, counts = [], []
    for t, s in enumerate(windows):
        try:
            w = normalize_window(s, f"windows[{t}]")
        except ValueError as e:
            raise PoolPackArgError(str(e)) from None
        norm.append(w)
        counts.append(0 if w is None else _cdiv(H, w[0]) * _cdiv(W, w[1]))
    return tuple(norm), tuple(counts)


def check_schedule(windows, T: int, grid: Tuple[int, int]) -> Schedule:
    """Validate ``windows`` (one window per frame) on ``grid``; cached by exact content."""
    H, W = grid
    if isinstance(windows, int) and not isinstance(windows, bool):
        # A bare int is a common slip for "[s] * T"; say so instead of failing on len().
        raise PoolPackArgError(f"windows: expected one window per frame (a sequence of length {T}), "
                               f"got the single value {windows!r}; use [{windows}] * {T}")
    if type(windows) is list or type(windows) is tuple:
        seq = tuple(windows)
        types = set(map(type, seq))
        if types <= _INT_TUPLE:
            if len(seq) != T:
                raise PoolPackArgError(f"windows: expected {T} windows (one per frame, frames.shape[0]), "
                                       f"got {len(seq)}")
            key = (seq, H, W)
            hit = _SCHEDULES.get(key)
            if hit is not None:
                return hit
            fast = _fast_windows(seq, H, W)
            if fast is not None:
                return _remember(_SCHEDULES, key, Schedule(key, grid, *fast))
    lst = _as_list(windows, "windows")
    if len(lst) != T:
        raise PoolPackArgError(f"windows: expected {T} windows (one per frame, frames.shape[0]), got {len(lst)}")
    norm, counts = _slow_windows(lst, H, W)
    key = ("windows", norm, H, W)
    hit = _SCHEDULES.get(key)
    if hit is not None:
        return hit
    return _remember(_SCHEDULES, key, Schedule(key, grid, norm, counts))


def _dest_error(sched: Schedule, d: np.ndarray, L: int):
    """Name the first bad block (range first, then overlaps), as the slow path would."""
    kept = sched.cnt > 0
    end = d + sched.cnt
    bad = np.flatnonzero(kept & ((d < 0) | (end > L)))
    if bad.size:
        t = int(bad[0])
        raise PoolPackArgError(f"dest[{t}]: block [{int(d[t])}, {int(end[t])}) of frame {t} is outside "
                               f"out's {L} rows")
    ts = np.flatnonzero(kept)
    order = ts[np.lexsort((ts, end[ts], d[ts]))]
    s, e = d[order], end[order]
    over = np.flatnonzero(s[1:] < e[:-1])
    if over.size:
        i = int(over[0])
        ta, tb = int(order[i]), int(order[i + 1])
        raise PoolPackArgError(f"dest: blocks of frames {ta} [{int(d[ta])}, {int(end[ta])}) and {tb} "
                               f"[{int(d[tb])}, {int(end[tb])}) overlap")


def check_dest(dest, sched: Schedule, L: int) -> DestEntry:
    """Validate ``dest`` for ``sched`` and an ``out`` of ``L`` rows; the entry's dest has 0 for
    dropped frames (their value is ignored, whatever it is). Cached by exact content."""
    T = len(sched.windows)
    if type(dest) is list or type(dest) is tuple:
        seq = tuple(dest)
        if len(seq) != T:
            raise PoolPackArgError(f"dest: expected {T} row offsets (one per frame), got {len(seq)}")
        if set(map(type, seq)) <= _INT:
            key = (seq, sched.uid, L)
            hit = _DESTS.get(key)
            if hit is not None:
                return hit
            d = np.fromiter(seq, np.int64, T)
            kept = sched.cnt > 0
            d = np.where(kept, d, 0)
            end = d + sched.cnt
            ok = True
            if kept.any():
                dk, ek = d[kept], end[kept]
                if int(dk.min()) < 0 or int(ek.max()) > L:
                    ok = False
                else:
                    o = np.argsort(dk, kind="stable")
                    ok = bool((dk[o][1:] >= ek[o][:-1]).all())
            if not ok:
                _dest_error(sched, d, L)
            return _remember(_DESTS, key, DestEntry(tuple(d.tolist())))
    lst = _as_list(dest, "dest")
    if len(lst) != T:
        raise PoolPackArgError(f"dest: expected {T} row offsets (one per frame), got {len(lst)}")
    d = np.zeros(T, np.int64)
    for t, c in enumerate(sched.counts):
        if c:  # a dropped frame writes nothing; its dest is ignored
            d[t] = _as_int(lst[t], f"dest[{t}]")
    _dest_error(sched, d, L)
    return DestEntry(tuple(d.tolist()))


def check_args(frames, windows, grid=(16, 16), out=None, dest=None,
               dtypes: Sequence[torch.dtype] = KERNEL_DTYPES) -> LaunchPlan:
    """Validate ``pool_pack``'s arguments and normalise them into a :class:`LaunchPlan`.

    Raises :class:`PoolPackArgError` (a ``ValueError``) naming the offending argument."""
    if not isinstance(frames, torch.Tensor):
        raise PoolPackArgError(f"frames: expected a torch.Tensor [T, H*W, D], got {type(frames).__name__}")
    if frames.dim() != 3:
        raise PoolPackArgError(f"frames: expected rank 3 [T, H*W, D], got shape {tuple(frames.shape)}")
    if frames.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise PoolPackArgError(f"frames: dtype {str(frames.dtype).replace('torch.', '')} is not supported "
                               f"here; use one of {names}")
    try:
        H, W = _check_grid(grid)
    except ValueError as e:
        raise PoolPackArgError(str(e)) from None
    T, N, D = frames.shape
    if H * W != N:
        raise PoolPackArgError(f"grid: {H}x{W} = {H * W} tokens but frames has {N} tokens per frame "
                               f"(frames.shape[1]); pass the grid the frames were encoded on")
    if D < 1:
        raise PoolPackArgError("frames: the hidden size (frames.shape[2]) must be >= 1")

    sched = check_schedule(windows, T, (H, W))

    if out is None:
        if dest is not None:
            raise PoolPackArgError("dest: given without out; pass out=<2-D buffer> too, or drop dest")
        return LaunchPlan(T, N, D, (H, W), sched.windows, sched.counts, sched.starts, sched.total, sched, None)

    if not isinstance(out, torch.Tensor):
        raise PoolPackArgError(f"out: expected a torch.Tensor [L, D], got {type(out).__name__}")
    if out.dim() != 2:
        raise PoolPackArgError(f"out: expected a 2-D [L, D] tensor (e.g. inputs_embeds.view(-1, D)), "
                               f"got shape {tuple(out.shape)}")
    if out.shape[1] != D:
        raise PoolPackArgError(f"out: has {out.shape[1]} columns but frames has D = {D}")
    if out.dtype != frames.dtype:
        raise PoolPackArgError(f"out: dtype {out.dtype} differs from frames' {frames.dtype}; cast one of them")
    if out.device != frames.device:
        raise PoolPackArgError(f"out: on {out.device} but frames on {frames.device}; move one of them")
    if dest is None:
        raise PoolPackArgError("dest: required with out (dest[t] = first row of frame t's block)")
    L = out.shape[0]
    entry = check_dest(dest, sched, L)
    return LaunchPlan(T, N, D, (H, W), sched.windows, sched.counts, entry.dest, L, sched, entry)

