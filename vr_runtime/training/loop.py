"""The training driver: accelerate (DDP / FSDP / DeepSpeed ZeRO-2 from the launcher's config),
AdamW, warm-up + cosine schedule, gradient accumulation, clipping, TensorBoard + JSON logging,
tqdm progress, checkpoints every ``save_steps`` and per epoch, and exact resumption.

Outputs in ``cfg.output_dir``: ``routers.safetensors`` (loadable by
``VideoRouter.from_pretrained(..., routers=...)``), Stage 3 also ``hf/`` (the fine-tuned model in
Hugging Face format + tokenizer) and ``model.safetensors`` (its plain state dict, the format of
``vr_runtime/assets/tiny/``); ``log.jsonl`` (loss curve), ``metrics.json`` (held-out
evaluation), ``checkpoint-<step>/`` (accelerate state + trainer_state.json, written whole or
not at all: see ``checkpoints.py``).
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import List, Optional

import torch
from safetensors.torch import save_file
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from vr_runtime import backbones
from vr_runtime.backbones.weights import nonfinite
from vr_runtime.routing.routers import RouterConfig, Routers

from . import checkpoints as ckpt
from .config import TrainConfig
from .data import DataFormatError, Example, read_jsonl
from .evaluate import evaluate_stage
from .features import FeatureCache
from .stages import Trainee, apply_freezing

KINDS = {1: "relevance", 2: "policy", 3: "conversation"}
LOCK = ".train.lock"     # holds the pid of the training that writes the output folder


class DivergedError(ValueError):
    """The loss or the weights became NaN or inf: training stops (one line: the step, the last
    finite checkpoint, what to do), and nothing non-finite is written as a result."""


class OutputLock:
    """``output_dir/.train.lock``: an exclusive ``flock`` held for the whole training, with the
    holder's pid in the file for the message. A second training into the same folder is refused
    instead of mixing its files with the first's; the kernel drops the lock when its holder
    dies, even by ``kill -9``, so a stale file never blocks."""

    def __init__(self, output_dir: str):
        import fcntl
        self.path = os.path.join(output_dir, LOCK)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                pid = os.pread(self.fd, 32, 0).decode(errors="replace").strip() or "unknown"
            finally:
                os.close(self.fd)
            raise ckpt.CheckpointError(
                f"output_dir {output_dir!r} is in use by another training (pid {pid}); wait "
                f"for it to finish or pass another output_dir (--set output_dir=...)") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)     # closing drops the flock; the file stays for the next run
            self.fd = None


def _finite_or_none(v):
    """A log value as JSON can hold it: NaN and inf become null (json.dumps would write a bare
    NaN, which is not JSON)."""
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _all_finite(acc, loss) -> bool:
    """Whether the loss is finite on every rank (one small all-reduce when there are several,
    so that all ranks stop together)."""
    ok = bool(torch.isfinite(loss.detach()).all())
    if acc.num_processes > 1:
        flag = torch.tensor([0.0 if ok else 1.0], device=acc.device)
        ok = float(acc.reduce(flag, reduction="sum").item()) == 0.0
    return ok


class StageDataset(Dataset):
    """Examples -> dicts of tensors (features from the cache; question ids; labels).
    ``dialogues``: each item also carries the other questions about the same frames
    (``turns``, for a curriculum that lays out dialogues: ``Curriculum.siblings``)."""

    def __init__(self, examples: List[Example], stage: int, tokenizer, cache=None,
                 progress: bool = True, dialogues: bool = False):
        self.examples, self.stage, self.cache = examples, stage, cache
        self.q_ids = []
        for ex in examples:
            # the routers' text (the bare question), tokenised as runtime.embed_question does
            ids = tokenizer(ex.routed_question, add_special_tokens=False)["input_ids"]
            self.q_ids.append(torch.tensor(ids, dtype=torch.long))
        self.siblings = _siblings(examples) if dialogues else None
        if stage != 2 and cache is not None:
            cache.fill([(ex.video, ex.frames) for ex in examples], progress=progress)
            for ex in examples:  # the labels index the sampled frames: their counts must agree
                T = cache.get(ex.video, ex.frames).shape[0]
                if ex.frame_labels is not None and len(cache.labels(ex.frame_labels)) != T:
                    raise DataFormatError(
                        f"{ex.video}: {len(ex.frame_labels)} frame_labels but {T} frames were "
                        f"sampled (num_frames={cache.num_frames}); the video has fewer frames "
                        f"than asked for, or num_frames does not match the labels")

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, i):
        ex = self.examples[i]
        d = {"q_ids": self.q_ids[i], "question": ex.question, "answer": ex.answer,
             "policy": ex.policy, "index": i}
        if ex.frame_labels is not None:
            d["labels"] = self._labels(ex)
        if self.stage != 2:
            d["v"] = self.cache.get(ex.video, ex.frames)   # the line's own T, if it has one
            d["times"] = self.cache.times(ex.video, ex.frames)   # for prompts with timestamps
        if self.siblings and self.siblings[i]:
            d["turns"] = [self._turn(self.examples[j]) for j in self.siblings[i]]
        return d

    def _labels(self, ex: Example) -> torch.Tensor:
        """Per routing unit (``FeatureCache.labels``)."""
        labels = self.cache.labels(ex.frame_labels) if self.cache is not None \
            else ex.frame_labels
        return torch.tensor(labels, dtype=torch.float32)

    def _turn(self, ex: Example) -> dict:
        turn = {"question": ex.question, "answer": ex.answer}
        if ex.frame_labels is not None:
            turn["labels"] = self._labels(ex)
        return turn


def _siblings(examples: List[Example]) -> List[List[int]]:
    """For each example, the indices of the others with an answer about the same video at the
    same sampled frame count (the same frames), in file order."""
    groups: dict = {}
    for i, ex in enumerate(examples):
        if ex.answer is not None:
            groups.setdefault((ex.video, ex.frames), []).append(i)
    return [[j for j in groups.get((ex.video, ex.frames), []) if j != i]
            if ex.answer is not None else [] for i, ex in enumerate(examples)]


def collate(batch):
    return list(batch)


def to_device(batch, device):
    return [{k: (v.to(device) if torch.is_tensor(v) else v) for k, v in ex.items()}
            for ex in batch]


def _num_frames(cfg: TrainConfig, examples: List[Example]) -> int:
    """The default T of a file: the one label length of its lines without their own
    ``num_frames`` (lines with it, e.g. the synthetic task v2, are sampled at their own T)."""
    ns = {ex.num_frames for ex in examples if ex.num_frames and ex.frames is None}
    if len(ns) > 1:
        raise DataFormatError(f"frame_labels of different lengths {sorted(ns)} in one file; "
                              f"use one num_frames per training file")
    return ns.pop() if ns else cfg.num_frames


def build(cfg: TrainConfig, device=None, lm=None):
    """Model, routers (with the stage's freezing) and the Trainee."""
    if lm is None:
        lm = backbones.load_backbone(cfg.model, device=device or "cpu", dtype=torch.float32)
    if cfg.routers:
        routers = Routers.load(cfg.routers, lm)
    else:
        rcfg = RouterConfig(num_layers=cfg.router_num_layers, router_dim=cfg.router_dim,
                            num_heads=cfg.router_heads, router_pool=cfg.router_pool)
        routers = Routers.from_backbone(lm, rcfg, seed=cfg.seed)
    routers.to(lm.device)
    trainee = Trainee(lm, routers, cfg)
    params = apply_freezing(lm, routers, cfg.trainable_groups, trainee.curriculum.frozen(lm))
    return lm, routers, trainee, params


def _optimizer(params, cfg: TrainConfig):
    # Weight decay on matrices only (biases, norms and the [CLS] vector are not decayed).
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=cfg.learning_rate, betas=(0.9, 0.999), eps=1e-8)


def _resume_candidates(resume: Optional[str], output_dir: str, main: bool):
    """[(checkpoint, state)] to try in order: the named one, or for ``latest`` every complete
    checkpoint newest first (one line on stderr names the torn ones skipped)."""
    if not resume:
        return []
    if resume != "latest":
        return [(resume, ckpt.read_state(resume))]
    good, torn = ckpt.latest(output_dir)
    if main and torn:
        print(f"resume: skipped torn checkpoint(s): {ckpt.describe_skipped(torn)}",
              file=sys.stderr)
    if main and not good:
        print(f"resume: no complete checkpoint in {output_dir}; starting at step 0",
              file=sys.stderr)
    return good


def _load_state(acc, cands, main: bool):
    """Load the first candidate that loads; a failure of a named checkpoint, or of every
    ``latest`` candidate, is one ``CheckpointError`` line."""
    for i, (path, st) in enumerate(cands):
        try:
            acc.load_state(path)
            return path, st
        except Exception as e:  # torch / safetensors / pickle raise many types on torn files
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            if len(cands) == 1 or i == len(cands) - 1:
                raise ckpt.CheckpointError(
                    f"checkpoint {path!r}: cannot be loaded ({why}); remove it or pass "
                    f"another --resume") from None
            if main:
                print(f"resume: skipped unloadable checkpoint {os.path.basename(path)} ({why})",
                      file=sys.stderr)
    return None, None


def train(cfg: TrainConfig, resume: Optional[str] = None, progress: bool = True, lm=None,
          pack=None, cache_dir: Optional[str] = None, evaluate: bool = True) -> dict:
    """Run one stage; returns {"global_step", "history", "metrics", "output_dir"}."""
    # accelerate and transformers load when a stage runs, not at import: the CLI imports this
    # module (DivergedError) for every command, data generation and labelling included
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration, DistributedDataParallelKwargs, set_seed

    # The whole config and every file it names, before anything is loaded.
    cfg.validate().check_files(model=lm is None)
    if resume and resume != "latest":
        ckpt.read_state(resume)
    # Both data files are parsed now: a bad line stops the run before the model loads, and
    # not after training ends (the held-out file).
    examples = read_jsonl(cfg.train_data, KINDS[cfg.stage])
    frames = _num_frames(cfg, examples)
    heldout = read_jsonl(cfg.eval_data, KINDS[cfg.stage]) if (evaluate and cfg.eval_data) \
        else None
    cuda = torch.cuda.is_available()
    trackers = [t for t in cfg.report_to if t in ("tensorboard",)]
    acc = Accelerator(
        gradient_accumulation_steps=cfg.gradient_accumulation_steps, cpu=not cuda,
        mixed_precision="bf16" if (cfg.bf16 and cuda) else "no",
        log_with=trackers or None, project_dir=cfg.output_dir,
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    set_seed(cfg.seed)
    main = acc.is_main_process
    os.makedirs(cfg.output_dir, exist_ok=True)
    lock = OutputLock(cfg.output_dir) if main else None
    data = _StageData(examples, frames, heldout, trackers)
    try:
        return _train(_StageRun(cfg, acc, main, progress), resume, data, lm, pack, cache_dir)
    finally:
        if lock is not None:
            lock.release()


@dataclass
class _StageData:
    """What a stage reads before its model loads: the training examples, the frames each one
    has, the held-out examples (None: no evaluation) and the trackers to log to."""
    examples: list
    frames: int
    heldout: Optional[list]
    trackers: list


def _train(run: "_StageRun", resume, data: _StageData, lm, pack, cache_dir) -> dict:
    if run.main:
        ckpt.tidy(run.cfg.output_dir)   # unfinished saves of a killed run
    run.acc.wait_for_everyone()
    resume_from = _resume_candidates(resume, run.cfg.output_dir, run.main)
    run.set_up(lm, pack, cache_dir, data.examples, data.frames, data.trackers)
    run.restore(resume_from)
    run.train_steps()
    return run.finish(data.heldout, data.trackers)


class _StageRun:
    """The state of one stage's training on every rank: model, loader, optimizer and schedule
    (``set_up``), the step counters and loss history a checkpoint restores (``restore``), the
    optimisation steps (``train_steps``), checkpoints (``save``) and the final outputs
    (``finish``). The calls run in that order; each consumes the random streams exactly as the
    single function it replaces did, so resumed runs stay bit-identical."""

    def __init__(self, cfg: TrainConfig, acc, main: bool, progress: bool):
        self.cfg, self.acc, self.main, self.progress = cfg, acc, main, progress
        self.step, self.epoch, self.skip, self.micro, self.elapsed = 0, 0, 0, 0, 0.0
        self.history: List[dict] = []
        self.window: List[dict] = []
        self.saved = set()   # steps this run has checkpointed (the final save does not repeat one)
        self.log_path = os.path.join(cfg.output_dir, "log.jsonl")
        self.resumed_from = None   # the checkpoint loaded (kept by retention)
        self.last_good = None      # the newest checkpoint known to hold finite weights
        self.bar = None
        self.t0 = 0.0

    # -- set-up ------------------------------------------------------------------------------

    def set_up(self, lm, pack, cache_dir, examples, frames, trackers) -> None:
        cfg, acc = self.cfg, self.acc
        self.lm, self.routers, trainee, self.params = build(cfg, device=acc.device, lm=lm)
        if pack is not None:
            trainee.pack = pack
        if cfg.gradient_checkpointing and cfg.stage == 3:
            # Safe because the plan is decided once, outside the recomputed region, under no_grad.
            self.lm.decoder().gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
            self.lm.decoder().train()
        self.cache = self._feature_cache(frames, cache_dir)
        with acc.main_process_first():  # rank 0 fills the on-disk feature cache, others read it
            ds = StageDataset(examples, cfg.stage, self.lm.tokenizer, self.cache,
                              progress=self.progress and self.main,
                              dialogues=cfg.stage == 3 and trainee.curriculum.siblings)
        g = torch.Generator().manual_seed(cfg.seed)
        loader = DataLoader(ds, batch_size=cfg.per_device_train_batch_size, shuffle=True,
                            collate_fn=collate, generator=g, drop_last=False)
        opt = _optimizer(self.params, cfg)
        self.trainee, self.opt, self.loader = acc.prepare(trainee, opt, loader)
        self._schedule()
        if trackers:
            acc.init_trackers(f"stage{cfg.stage}",
                              config={k: v for k, v in cfg.to_dict().items()
                                      if isinstance(v, (int, float, str, bool))})

    def _feature_cache(self, frames: int, cache_dir: Optional[str]):
        """The vision features of Stages 1 and 3 (Stage 2 reads none), cached on disk next to
        the training file unless ``cache_dir`` names another folder."""
        if self.cfg.stage == 2:
            return None
        return FeatureCache(self.lm, frames,
                            cache_dir or os.path.join(os.path.dirname(
                                os.path.abspath(self.cfg.train_data)), ".vr_cache"))

    def _schedule(self) -> None:
        """The total number of optimisation steps and the warm-up + decay learning rate."""
        from transformers import get_scheduler
        cfg = self.cfg
        steps_per_epoch = math.ceil(len(self.loader) / cfg.gradient_accumulation_steps)
        self.total = cfg.max_steps if cfg.max_steps > 0 else \
            int(math.ceil(steps_per_epoch * cfg.num_train_epochs))
        self.sched = get_scheduler(cfg.lr_scheduler_type, self.opt,
                                   num_warmup_steps=int(math.ceil(cfg.warmup_ratio * self.total)),
                                   num_training_steps=self.total)
        self.acc.register_for_checkpointing(self.sched)

    # -- restore -----------------------------------------------------------------------------

    def restore(self, resume_from) -> None:
        """Load the first loadable checkpoint of ``resume_from`` and continue its counters,
        history and log; with none, start at step 0 with a fresh ``log.jsonl``."""
        cfg, main = self.cfg, self.main
        resume, st = _load_state(self.acc, resume_from, main)
        self.resumed_from = self.last_good = resume
        if not resume:
            if main and os.path.exists(self.log_path):
                os.remove(self.log_path)
            return
        bad = _nonfinite_weights(self.acc, self.trainee)
        if bad:
            raise ckpt.CheckpointError(f"checkpoint {resume!r}: {bad}; it was saved after the "
                                       f"training diverged: resume from an earlier one")
        self.step, self.epoch, self.skip = st["global_step"], st["epoch"], st["micro_step_in_epoch"]
        self.history, self.window = st["history"], st.get("window", [])
        self.elapsed = float(st.get("elapsed_s", 0.0))
        if os.path.realpath(resume) == os.path.realpath(
                ckpt.checkpoint_dir(cfg.output_dir, self.step)):
            self.saved.add(self.step)
        if main:
            # log.jsonl continues from the checkpoint: the steps logged after it are dropped
            # (they are run again), so no step appears twice
            ckpt.write_lines_atomic(self.log_path, [json.dumps(r) + "\n" for r in self.history])
            print(f"resumed from {resume} at step {self.step} (epoch {self.epoch}, "
                  f"batch {self.skip})")

    # -- the steps ---------------------------------------------------------------------------

    def train_steps(self) -> None:
        """Epochs until ``total`` steps; a checkpoint per epoch when ``save_steps`` is 0, and
        one at the end."""
        self.trainee.train()
        self.bar = tqdm(total=self.total, initial=self.step, desc=f"stage {self.cfg.stage}",
                        disable=not (self.main and self.progress))
        self.t0 = time.time() - self.elapsed   # elapsed_s continues from the checkpoint's
        self.micro = self.skip
        while self.step < self.total:
            if self._epoch():
                break
            self.epoch += 1
            self.skip = 0
            if not self.cfg.save_steps:
                self.save(self.step, self.epoch, 0)
        self.bar.close()
        self.save(self.step, self.epoch, self.micro)

    def _epoch(self) -> bool:
        """One pass over the loader, from batch ``skip`` when resuming inside an epoch; True
        when the last step is reached before its end."""
        cfg = self.cfg
        self.loader.set_epoch(self.epoch)
        it = self.acc.skip_first_batches(self.loader, self.skip) if self.skip else self.loader
        self.micro = self.skip
        for batch in it:
            self.micro += 1
            if not self._micro_step(batch):
                continue
            self.step += 1
            self.bar.update(1)
            if self.step % cfg.logging_steps == 0 or self.step == self.total:
                self._log()
            if cfg.save_steps and self.step % cfg.save_steps == 0:
                self.save(self.step, self.epoch, self.micro)
            if self.step >= self.total:
                return True
        return False

    def _micro_step(self, batch) -> bool:
        """Forward and backward of one batch; the optimizer steps once every
        ``gradient_accumulation_steps`` batches. True when it stepped."""
        acc, cfg = self.acc, self.cfg
        with acc.accumulate(self.trainee):
            out = self.trainee(to_device(batch, acc.device))
            if not _all_finite(acc, out["loss"]):
                self.diverged(self.step + 1, f"the loss is {float(out['loss'].detach()):g}")
            acc.backward(out["loss"])
            if acc.sync_gradients:
                if cfg.max_grad_norm:
                    acc.clip_grad_norm_(self.params, cfg.max_grad_norm)
                self.opt.step()
                self.sched.step()
                self.opt.zero_grad(set_to_none=True)
        self.window.append({k: float(v.detach()) for k, v in out.items()})
        return acc.sync_gradients

    def _log(self) -> None:
        """The mean of the losses since the last record: history, trackers, ``log.jsonl``."""
        window = self.window
        rec = {k: _finite_or_none(sum(w[k] for w in window) / len(window)) for k in window[0]}
        rec.update(step=self.step,
                   epoch=round(self.epoch + self.micro / max(len(self.loader), 1), 3),
                   lr=_finite_or_none(self.sched.get_last_lr()[0]),
                   elapsed_s=round(time.time() - self.t0, 1))
        self.window = []
        self.history.append(rec)
        self.acc.log({k: v for k, v in rec.items() if k != "step"}, step=self.step)
        self.bar.set_postfix(loss=f"{rec['loss']:.4f}")
        if self.main:
            with open(self.log_path, "a") as f:
                f.write(json.dumps(rec, allow_nan=False) + "\n")

    # -- checkpoints and outputs -------------------------------------------------------------

    def save(self, tag_step: int, ep: int, micro: int) -> None:
        """``checkpoint-<tag_step>``, written whole or not at all (once per step)."""
        cfg, acc, main = self.cfg, self.acc, self.main
        if tag_step in self.saved:
            return
        bad = _nonfinite_weights(acc, self.trainee)
        if bad:
            self.diverged(tag_step, f"the weights became non-finite ({bad})")
        tmp = ckpt.begin(cfg.output_dir, tag_step) if main else \
            ckpt.checkpoint_dir(cfg.output_dir, tag_step) + ckpt.TMP
        acc.wait_for_everyone()
        acc.save_state(tmp)
        acc.wait_for_everyone()   # every rank's shards are in tmp before it is committed
        if main:
            self.routers.trained = True
            acc.unwrap_model(self.trainee).routers.save(os.path.join(tmp, "routers.safetensors"))
            ckpt.commit(tmp, {"global_step": tag_step, "epoch": ep, "micro_step_in_epoch": micro,
                              "history": self.history, "window": self.window,
                              "elapsed_s": round(time.time() - self.t0, 3),
                              "config": cfg.to_dict()})
            # Retention after the commit, never before: the new checkpoint is complete before
            # an old one goes, and the one resumed from stays (checkpoints.prune). accelerate's
            # ProjectConfiguration(total_limit=...) does not fit: it prunes only its own
            # automatic project_dir/checkpoints/checkpoint_<n> folders, and deletes before
            # writing the new one (a kill then can leave no complete checkpoint).
            ckpt.prune(cfg.output_dir, cfg.save_total_limit, protect=(self.resumed_from,))
        self.saved.add(tag_step)
        self.last_good = ckpt.checkpoint_dir(cfg.output_dir, tag_step)
        acc.wait_for_everyone()

    def diverged(self, at_step: int, what: str):
        self.bar.close()
        last_good = self.last_good
        where = (f"the last finite checkpoint is {last_good} (--resume {last_good})"
                 if last_good else "no checkpoint was saved before it")
        raise DivergedError(f"training stopped at step {at_step}: {what}; {where}; lower "
                            f"learning_rate (now {self.cfg.learning_rate:g}) or check the data")

    def finish(self, heldout, trackers) -> dict:
        """The routers (and Stage 3's model) in ``output_dir``, the held-out evaluation in
        ``metrics.json``; returns the result of ``train``."""
        cfg, acc = self.cfg, self.acc
        result = {"global_step": self.step, "history": self.history,
                  "output_dir": cfg.output_dir, "metrics": {},
                  "trainee": acc.unwrap_model(self.trainee), "num_processes": acc.num_processes}
        acc.wait_for_everyone()
        if self.main:
            model = acc.unwrap_model(self.trainee)
            model.eval()
            self.routers.trained = True
            model.routers.save(os.path.join(cfg.output_dir, "routers.safetensors"))
            if cfg.stage == 3:
                save_llm(model.model, self.lm.tokenizer, cfg.output_dir)
            if heldout is not None:
                ev = heldout[:cfg.eval_limit] if cfg.eval_limit else heldout
                result["metrics"] = evaluate_stage(model, ev, self.cache, progress=self.progress)
            ckpt.write_json_atomic(os.path.join(cfg.output_dir, "metrics.json"),
                                   {"stage": cfg.stage, "global_step": self.step,
                                    "metrics": result["metrics"], "config": cfg.to_dict()},
                                   indent=2)
        if trackers:
            acc.end_training()
        return result


def _nonfinite_weights(acc, trainee) -> Optional[str]:
    """What holds NaN or inf among the trained weights (None: all finite)."""
    model = acc.unwrap_model(trainee)
    return nonfinite((n, p) for n, p in model.named_parameters() if p.requires_grad)


def save_llm(model, tokenizer, output_dir: str) -> None:
    """Stage 3's model: Hugging Face format (``hf/``) and a plain safetensors state dict."""
    model.save_pretrained(os.path.join(output_dir, "hf"), safe_serialization=True)
    tokenizer.save_pretrained(os.path.join(output_dir, "hf"))
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(output_dir, "model.safetensors"), metadata={"format": "pt"})
