"""The evaluation loop: questions x methods x budgets x frame counts -> predictions -> tables.

Work that does not depend on the question or the method is done once per video and frame
count: the video is opened once (checked, indexed, sampled: a ``FileSource``) and handed to
every ``VideoRouter.answer(..., cache_visual=True)`` call; the first streams its frames through
the vision tower, so each model encodes Z (and the Image Router's question-independent state)
once per video, and no decoded clip is held (a window of frames at a time, at any frame count).
Questions are therefore processed grouped by video.

Data-parallel: under ``accelerate launch --num_processes N`` videos are sharded round-robin
over ranks (sorted by path, so the split does not depend on the order in the file); each rank
appends its predictions to ``OUT/predictions.part<rank>.jsonl`` as it goes (a killed run loses
at most the question in flight, or the batch in flight with ``batch_size`` > 1); at the end every rank's new predictions are gathered on rank 0,
which writes ``predictions.jsonl`` (sorted) and the tables. A rerun with the same OUT skips the
(question, method, budget, frames) combinations already in ``predictions.jsonl`` or a part file
(and says "resuming: N of M done"); it refuses to reuse them when ``settings.json`` differs
from the run's settings, or is missing or unreadable.

Batches (``batch_size`` > 1, beyond the paper's single-sample protocol): up to that many
questions of one video, frame count, method and budget go through ``VideoRouter.answer_batch``,
prefilled and decoded together; the predictions are those of the one-by-one path. Each row then
says ``"batch": n``, and its ``ttft_s`` holds the batch's prefill (all n prompts) in place of
its own, so the paper's per-sample TTFT needs the default batch size 1.

Faults: a video that cannot be decoded does not stop the run; its questions are recorded with
the reason (``"failed"``), counted apart from wrong answers, and retried by the next run. A write
that fails (a full disk) names its file; the results files are replaced all together or not at
all (``atomic.py``), so a failure leaves the previous set and the part files, and a rerun
completes it.
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import sys
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ..data.atomic import write_files_atomically
from ..errors import VideoError
from ..fingerprint import weights_fingerprint
from ..planning.scales import label as scales_label
from ..video.sampling import Sampling
from .benchmarks import Benchmark, BenchmarkError, Question, load_benchmark
from .methods import Method, parse_methods
from .prompting import PromptConfig, extract_answer, mc_prompt
from .tables import WRITE_HINT, write_outputs

# Budgets of the paper's sweep (B_img, visual tokens) and its frame counts.
PAPER_BUDGETS = (4096, 8192, 12288, 16384, 24576)
PAPER_FRAMES = (64, 128)
TEXT_ALLOWANCE = 8192   # max_length = B_img + this (the fixed budget bounds the visual tokens)


@dataclass
class EvalConfig:
    benchmark: str
    data: str
    videos: str
    out: str
    methods: str
    budgets: Tuple[int, ...] = PAPER_BUDGETS
    frames: Tuple[int, ...] = (64,)
    model: str = "tiny"
    routers: Optional[str] = None
    clip: Optional[str] = None
    data_ft_model: Optional[str] = None
    limit: Optional[int] = None
    skip_missing: bool = False
    prompt: PromptConfig = field(default_factory=PromptConfig)
    max_new_tokens: int = 16
    device: str = "cpu"
    dtype: Optional[str] = None
    progress: bool = True
    command: str = ""
    title: str = ""
    scales: object = (2, 1, 4)   # (s_g, s_1, s_0) or "auto" (vr_runtime.planning.scales)
    batch_size: int = 1   # questions of one video, method and budget prefilled together
    scorer: str = "image-router"          # --scorer: of the methods without a scorer of their own
    scorer_model: Optional[str] = None    # --scorer-model DIR
    seek: str = "exact"                   # --seek: exact (the paper's) or keyframe
    time_window: Optional[tuple] = None   # --time-window: (start_s, end_s) of every video


Key = Tuple[str, str, Optional[int], int]   # (id, method, budget, frames)


def prediction_key(p: dict) -> Key:
    return (str(p["id"]), p["method"], p["budget"], int(p["frames"]))


def read_predictions(out: pathlib.Path) -> Dict[Key, dict]:
    """Predictions already made in ``out`` (the merged file and any part files)."""
    done: Dict[Key, dict] = {}
    files = [out / "predictions.jsonl"] + sorted(out.glob("predictions.part*.jsonl"))
    for f in files:
        if not f.is_file():
            continue
        for i, line in enumerate(f.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                p = json.loads(line)
                key = prediction_key(p)
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                # A line cut short by a kill: the combination is simply redone.
                continue
            if not p.get("failed"):      # a failed video is retried by every rerun
                done[key] = p
    return done


def jobs_for(bench: Benchmark, methods: Sequence[Method], budgets: Sequence[int],
             frames: Sequence[int]) -> List[Tuple[Question, Method, Optional[int], int]]:
    """Every combination, grouped by video then frame count (the visual cache's order)."""
    by_video: Dict[str, List[Question]] = {}
    for q in bench.questions:
        by_video.setdefault(q.video, []).append(q)
    jobs = []
    for video in sorted(by_video):
        for F in frames:
            for m in methods:
                for b in (budgets if m.budgeted else (None,)):
                    for q in by_video[video]:
                        jobs.append((q, m, b, F))
    return jobs


def shard_videos(videos: Iterable[str], rank: int, world: int) -> set:
    return {v for i, v in enumerate(sorted(set(videos))) if i % world == rank}


class Evaluator:
    """Loads the models a run needs (lazily) and makes one job's prediction at a time."""

    def __init__(self, cfg: EvalConfig):
        self.cfg = cfg
        self._models: Dict[str, object] = {}
        self._clip = None
        self._scorer = None          # --scorer (None: the runtime's Image Router, timed)
        from .ttft import ColdCosts
        self._cold = ColdCosts()     # the cached stages' measured cost, added back per method

    def resources(self) -> dict:
        return {"clip": self.cfg.clip, "data_ft_model": self.cfg.data_ft_model,
                "clip_scorer": self._clip}

    def load(self, methods: Sequence[Method]) -> None:
        import torch
        from ..backbones.devices import resolve_device, resolve_dtype
        from ..runtime import VideoRouter
        dev = resolve_device(self.cfg.device)
        dtype = resolve_dtype(self.cfg.dtype, dev)
        for m in methods:
            if m.model in self._models:
                continue
            path = self.cfg.model if m.model == "main" else getattr(self.cfg, m.model)
            routers = self.cfg.routers if m.model == "main" else None
            self._models[m.model] = VideoRouter.from_pretrained(
                path, routers=routers, device=dev, dtype=dtype, visual_cache_size=1)
        from ..routing.scorers import DEFAULT_SCORER, build_scorer
        if self.cfg.scorer != DEFAULT_SCORER and self._scorer is None:
            self._scorer = build_scorer(self.cfg.scorer, self.cfg.scorer_model, device=dev,
                                        dtype=dtype, cache_visual=True)
        if any("clip" in m.needs for m in methods) and self._clip is None:
            from ..routing.scorers import CLIPScorer
            self._clip = CLIPScorer.from_pretrained(self.cfg.clip, device=dev,
                                                    dtype=torch.float32)

    @property
    def main(self):
        return next(iter(self._models.values()))

    def _request(self, clip, q: Question, m: Method, budget: Optional[int], frames: int):
        """(model, (video, prompt), AnswerOptions): the ``VideoRouter.answer`` call of one
        job."""
        # budget-resize: a sibling over the same weights at its own frame size (methods.py)
        vr = m.router_for(self._models[m.model], budget, frames)
        cfg = self.cfg
        prompt = mc_prompt(q.question, q.options, cfg.prompt)
        if budget is None:   # no budget (dense): max_length only bounds the note in the report
            max_length = frames * vr.lm.grid[0] * vr.lm.grid[1] + TEXT_ALLOWANCE
        else:
            max_length = budget + TEXT_ALLOWANCE
        kw = m.answer_kwargs(self.resources())
        # The method's own windows (if any) win over --scales; auto reads the fixed budget.
        if not any(k in kw for k in ("scales", "relevant_window", "other_window",
                                     "global_window")):
            kw["scales"] = cfg.scales
        if "scorer" not in kw and "relevant" not in kw and self._scorer is not None:
            kw["scorer"] = self._scorer   # --scorer, for every method without its own
            for k in ("frame_batch", "router_pool"):   # the default Image Router's settings
                kw.pop(k, None)
        elif "scorer" not in kw and "relevant" not in kw:
            # the runtime's cached Image Router, timed when it builds its visual state (ttft.py)
            from .ttft import TimedCachedImageRouterScorer
            kw["scorer"] = TimedCachedImageRouterScorer(frame_batch=kw.pop("frame_batch", None),
                                                        router_pool=kw.pop("router_pool", None))
        # InternVL3* samples its own frame count from the video (methods.Method.num_frames)
        n = m.num_frames(budget, frames, vr.lm.grid[0] * vr.lm.grid[1])
        if n != frames:   # decoded on its own, uncached: it would evict the shared visual state
            clip = q.video
        elif vr is not self._models[m.model]:   # decoded at the sibling's size, in its own cache
            clip = q.video
        kw.update(num_frames=n, max_length=max_length, max_new_tokens=cfg.max_new_tokens,
                  budget=budget, cache_visual=n == frames, router_question=q.question,
                  seek=cfg.seek, time_window=cfg.time_window)
        from ..request import AnswerOptions
        return vr, (clip, prompt), AnswerOptions(**kw)

    def predict(self, clip, q: Question, m: Method, budget: Optional[int], frames: int) -> dict:
        """One job's prediction record (a row of predictions.jsonl): the model's answer to
        question ``q`` by method ``m`` at ``budget`` and ``frames``, parsed and scored."""
        vr, (video, prompt), opts = self._request(clip, q, m, budget, frames)
        return self._prediction(vr, vr.answer(video, prompt, options=opts), opts, q, m, budget,
                                frames)

    def predict_batch(self, clip, qs: Sequence[Question], m: Method, budget: Optional[int],
                      frames: int) -> List[dict]:
        """The predictions of the questions of one video, method, budget and frame count,
        prefilled and decoded in one batch (``VideoRouter.answer_batch``): the same
        predictions as ``predict`` one by one; every timing but the prefill's and generation's
        is the question's own."""
        if len(qs) == 1:
            return [self.predict(clip, qs[0], m, budget, frames)]
        calls = [self._request(clip, q, m, budget, frames) for q in qs]
        vr = calls[0][0]
        answers = vr.answer_batch([a[0] for _, a, _ in calls], [a[1] for _, a, _ in calls],
                                  options=[opts for _, _, opts in calls])
        rows = [self._prediction(vr, res, opts, q, m, budget, frames)
                for res, (_, _, opts), q in zip(answers, calls, qs)]
        for r in rows:
            r["batch"] = len(qs)
        return rows

    def _prediction(self, vr, res, opts, q: Question, m: Method, budget: Optional[int],
             frames: int) -> dict:
        cfg = self.cfg
        r = res.report
        ttft, added = self._cold.add_back((id(vr), q.video, opts.num_frames), r, opts.scorer)
        pred = extract_answer(res.text, q.options, cfg.prompt.answer_mode)
        return {"id": q.id, "method": m.name, "budget": budget, "frames": frames,
                "prediction": pred, "response": res.text, "answer": q.answer,
                "correct": pred == q.answer, "visual_tokens": int(r["visual_tokens"]),
                "ttft_s": None if ttft is None else round(ttft, 6),
                "ttft_cached_s": r["timings_s"].get("ttft"),
                "ttft_added_back_s": round(added, 6), "policy": r["policy"],
                "category": q.category, "duration": q.duration,
                "video": pathlib.Path(q.video).name, "frames_used": len(r["frame_indices"]),
                "frames_kept": r.get("frames_kept"),
                "no_relevant_frame": bool(r.get("no_relevant_frame")),
                "visual_cache": r.get("visual_cache"),
                # each sampled frame's window, as the report has them (eval --html draws them)
                "windows": r.get("windows")}


def _dist(device: str):
    """(rank, world, state) under accelerate launch; (0, 1, None) otherwise. On CPU the
    processes talk over gloo (``cpu=True``: accelerate otherwise leaves a CPU-only launch
    undistributed)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1, None
    from accelerate import PartialState
    st = PartialState(cpu=str(device).startswith("cpu"))
    return st.process_index, st.num_processes, st


def run_eval(cfg: EvalConfig) -> Optional[dict]:
    """The whole run. Returns the results dict on rank 0 (None on other ranks)."""
    resources = {"clip": cfg.clip, "data_ft_model": cfg.data_ft_model}
    methods = parse_methods(cfg.methods, resources)
    for m in methods:   # budget-resize on InternVL3: refused before anything loads
        m.check_model(cfg.model if m.model == "main" else getattr(cfg, m.model))
    bench = load_benchmark(cfg.benchmark, cfg.data, cfg.videos, cfg.skip_missing, cfg.limit)
    out = pathlib.Path(cfg.out)
    rank, world, state = _dist(cfg.device)
    out.mkdir(parents=True, exist_ok=True)
    check_settings(out, cfg, write=rank == 0)
    done = read_predictions(out)
    mine = shard_videos([q.video for q in bench.questions], rank, world)
    all_jobs = jobs_for(bench, methods, cfg.budgets, cfg.frames)
    ours = [j for j in all_jobs if j[0].video in mine]
    todo = [j for j in ours if (j[0].id, j[1].name, j[2], j[3]) not in done]
    if rank == 0:
        n_done = sum((j[0].id, j[1].name, j[2], j[3]) in done for j in all_jobs)
        if 0 < n_done < len(all_jobs):
            sys.stderr.write(f"resuming: {n_done} of {len(all_jobs)} done\n")
    new: List[dict] = []
    if todo:
        ev = Evaluator(cfg)
        ev.load(methods)
        new = _predict_all(ev, todo, out / f"predictions.part{rank}.jsonl",
                           progress=cfg.progress and rank == 0, world=world,
                           done_before=len(ours) - len(todo), batch_size=cfg.batch_size)
    if state is not None:
        from accelerate.utils import gather_object
        state.wait_for_everyone()
        gathered = gather_object([new])
        new = [p for part in gathered for p in part]
    if rank != 0:
        if state is not None:
            state.wait_for_everyone()
        return None
    for p in new:
        done[prediction_key(p)] = p
    wanted = {(j[0].id, j[1].name, j[2], j[3])
              for j in jobs_for(bench, methods, cfg.budgets, cfg.frames)}
    preds = [done[k] for k in sorted(wanted, key=_sort_key) if k in done]
    results = write_outputs(out, preds, bench, methods, cfg, world)
    for f in out.glob("predictions.part*.jsonl"):
        f.unlink()
    if state is not None:
        state.wait_for_everyone()
    return results


def settings_of(cfg: EvalConfig) -> dict:
    """What a prediction depends on besides its key (id, method, budget, frames)."""
    return {"benchmark": cfg.benchmark, "model": str(cfg.model), "routers": cfg.routers,
            "clip": cfg.clip, "data_ft_model": cfg.data_ft_model,
            "scorer": cfg.scorer, "scorer_model": cfg.scorer_model,
            "prompt_style": cfg.prompt.style, "pre_prompt": cfg.prompt.pre_prompt,
            "post_prompt": cfg.prompt.post_prompt, "answer_mode": cfg.prompt.answer_mode,
            "max_new_tokens": cfg.max_new_tokens, "scales": scales_label(cfg.scales),
            "seek": cfg.seek,
            "time_window": list(cfg.time_window) if cfg.time_window is not None else None,
            # the weights themselves, not only their names: retrained or overwritten weights
            # must not resume from the predictions of the old ones
            "weights": {k: weights_fingerprint(v) for k, v in (
                ("model", cfg.model), ("routers", cfg.routers), ("clip", cfg.clip),
                ("data_ft_model", cfg.data_ft_model), ("scorer_model", cfg.scorer_model))
                if v is not None}}


# Settings added later, with the value every earlier run had: an OUT written before they
# existed still resumes when they are at that value.
SETTINGS_BEFORE = {"scales": "2,1,4", "scorer": "image-router", "scorer_model": None,
                   "seek": "exact", "time_window": None}


def check_settings(out: pathlib.Path, cfg: EvalConfig, write: bool) -> None:
    """A rerun resumes only with the settings the predictions in OUT were made with."""
    f = out / "settings.json"
    now = settings_of(cfg)
    before, problem = None, "is missing"
    if f.exists():
        try:
            before = json.loads(f.read_text(encoding="utf-8"))
            problem = None if isinstance(before, dict) else "is not a JSON object"
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            problem = f"cannot be read ({getattr(e, 'strerror', None) or e})"
    if problem is None:
        was = {k: before.get(k, SETTINGS_BEFORE.get(k, "not recorded")) for k in now}
        diff = sorted(k for k in now if was[k] != now[k])
        if diff:
            raise BenchmarkError(f"--out {str(out)!r} holds predictions made with other "
                                 f"settings ({', '.join(diff)}: {was[diff[0]]!r} "
                                 f"there, {now[diff[0]]!r} now); use another --out")
        return
    # Without the settings, predictions already in OUT cannot be told apart from ones made
    # with other settings: refuse to reuse them rather than mix them silently.
    n = len(read_predictions(out))
    if n:
        raise BenchmarkError(f"--out {str(out)!r} holds {n} predictions but its settings.json "
                             f"{problem}, so they cannot be matched to these settings; use "
                             f"another --out, or delete {out / 'predictions*.jsonl'} to start "
                             f"over")
    if write:
        write_files_atomically({f: json.dumps(now, indent=1) + "\n"}, WRITE_HINT)


def _sort_key(k: Key):
    qid, method, budget, frames = k
    return (method, -1 if budget is None else budget, frames, qid)


def failed_prediction(q: Question, m: Method, budget: Optional[int], frames: int,
                      reason: str) -> dict:
    """The record of a question whose video could not be decoded: kept in the predictions
    (with the reason), counted as ``failed`` in the tables, retried by a rerun."""
    return {"id": q.id, "method": m.name, "budget": budget, "frames": frames,
            "failed": reason, "prediction": None, "response": None, "answer": q.answer,
            "correct": False, "category": q.category, "duration": q.duration,
            "video": pathlib.Path(q.video).name}


def _no_space(e: OSError, path: pathlib.Path) -> OSError:
    """The OSError of a failed write, naming the file (a bare ``[Errno 28]`` names nothing)."""
    return OSError(e.errno, f"{e.strerror or e} (free space and rerun the same command to "
                   f"resume: the predictions written so far are kept)", str(path))


def _ends_mid_line(path: pathlib.Path) -> bool:
    try:
        with open(path, "rb") as fh:
            if fh.seek(0, os.SEEK_END) == 0:
                return False
            fh.seek(-1, os.SEEK_END)
            return fh.read(1) != b"\n"
    except FileNotFoundError:
        return False


def batches(todo, batch_size: int) -> List[list]:
    """Consecutive jobs of one video, frame count, method and budget, at most ``batch_size``
    a batch (``todo`` is in ``jobs_for``'s order, so such jobs are adjacent)."""
    out: List[list] = []
    for j in todo:
        q, m, b, F = j
        if out and len(out[-1]) < batch_size:
            q0, m0, b0, F0 = out[-1][0]
            if (q0.video, F0, m0.name, b0) == (q.video, F, m.name, b):
                out[-1].append(j)
                continue
        out.append([j])
    return out


def _predict_all(ev: Evaluator, todo, part: pathlib.Path, progress: bool, world: int,
                 done_before: int = 0, batch_size: int = 1) -> List[dict]:
    """Predict every job of ``todo`` (in ``jobs_for``'s order), appending each prediction to
    ``part`` as it is made; returns the new predictions. Each video is decoded once per frame
    count, the next one while the current one is answered."""
    from tqdm.auto import tqdm
    videos = _VideoQueue(todo, ev.main.lm.frame_spec, seek=ev.cfg.seek,
                         time_window=ev.cfg.time_window)
    new: List[dict] = []
    # A resumed run starts its bar at what is already done (and run_eval says so).
    bar = tqdm(total=done_before + len(todo), initial=done_before, disable=not progress,
               unit="answer", dynamic_ncols=True,
               mininterval=0.5 if sys.stderr.isatty() else 10.0,
               desc=f"eval ({world} proc)" if world > 1 else "eval", file=sys.stderr)
    cur, clip, failure = None, None, None
    with _open_part(part) as fh:
        for group in batches(todo, batch_size):
            q, m, b, F = group[0]
            if (q.video, F) != cur:
                if cur is not None:
                    for vr in ev._models.values():   # the last video's state is not needed
                        vr.clear_visual_cache()
                cur = (q.video, F)
                clip, failure = videos.next_clip()
            qs = [j[0] for j in group]
            if failure is None:
                try:   # a kill loses at most this batch
                    ps = [ev.predict(clip, q, m, b, F)] if len(qs) == 1 else \
                        ev.predict_batch(clip, qs, m, b, F)
                except VideoError as e:   # its frames failed to decode part-way
                    failure = videos.failed(e)
            if failure is not None:
                ps = [failed_prediction(qi, m, b, F, failure) for qi in qs]
            for p in ps:
                _append_prediction(fh, part, p)
                new.append(p)
                bar.update(1)
            bar.set_postfix_str(f"{m.name} B={b} T={F}", refresh=False)
    bar.close()
    return new


class _VideoQueue:
    """The (video, frame count) pairs of ``todo`` in order, each opened (checked, indexed,
    sampled: ``open_frames``) when its turn comes. Its frames are decoded by the first answer
    that needs them, streamed through the vision tower into the runtime's visual cache (Z, not
    pixels), so a long video at thousands of frames holds a window of frames, not a clip."""

    def __init__(self, todo, spec, seek: str, time_window):
        self.todo, self.spec, self.seek, self.time_window = todo, spec, seek, time_window
        self.order: List[Tuple[str, int]] = []
        for q, _, _, F in todo:
            if not self.order or self.order[-1] != (q.video, F):
                self.order.append((q.video, F))
        self.index = -1

    def next_clip(self):
        """(source, None) of the next pair, or (None, reason) when its video could not be
        opened (said on stderr)."""
        from ..video import frames as video_frames
        self.index += 1
        v, F = self.order[self.index]
        try:
            sampling = Sampling(F, self.time_window, seek=self.seek)
            return video_frames.open_frames(v, sampling, self.spec), None
        except Exception as e:  # noqa: BLE001 - one bad video must not stop the run
            return None, self.failed(e)

    def failed(self, e: BaseException) -> str:
        """The current video's failure (opening it, or decoding it part-way), said once."""
        from tqdm.auto import tqdm
        cur = self.order[self.index]
        # Decoding reads only this file: whatever fails is this video's failure.
        failure = f"{type(e).__name__}: {e}"
        n = sum(1 for j in self.todo if (j[0].video, j[3]) == cur)
        tqdm.write(f"eval: {cur[0]} ({cur[1]} frames) failed, its {n} answer(s) recorded as "
                   f"failed, going on: {failure}", file=sys.stderr)
        return failure


def _open_part(part: pathlib.Path):
    """This rank's predictions file, opened to append (on a line of its own)."""
    try:
        torn = _ends_mid_line(part)
        fh = open(part, "a")
        if torn:     # a kill cut the last line short: start ours on a line of their own
            fh.write("\n")
    except OSError as e:
        raise _no_space(e, part) from e
    return fh


def _append_prediction(fh, part: pathlib.Path, p: dict) -> None:
    try:
        fh.write(json.dumps(p) + "\n")
        fh.flush()
    except OSError as e:
        with contextlib.suppress(OSError):   # its buffer would fail again on close
            fh.close()
        raise _no_space(e, part) from e


__all__ = ["EvalConfig", "run_eval", "read_predictions", "jobs_for", "shard_videos",
           "PAPER_BUDGETS", "PAPER_FRAMES"]
