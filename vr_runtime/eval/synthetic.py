"""``videorouter eval --make-synthetic DIR``: a small benchmark in Video-MME layout built from the
tiny model's synthetic evidence task (``vr_runtime.data.synthetic_videos``).

Everything that touches the generator is in :func:`make_synthetic` (re-point it when the
generator grows). Video-MME's three duration groups become three video lengths at 2 fps:
``short`` 16 frames (8 s, the length the tiny model was trained on), ``medium`` 32 and ``long``
64 frames. The target appears in more frames in longer videos (2-3 per 16 frames) -- several
target frames per video, so uniform sampling of 16 frames still meets it at any length. Each
video has two targets of different colors and the generator's questions: one per target ("What
shape is the red object?", task type ``object_shape``), one about an absent color (answer
``none``, ``absent_color``), both with the options circle / square / triangle / none, and the
Global one ("What is the background color?", options the three backgrounds; ``background``).
Option order is shuffled per question.

Writes ``DIR/videomme/test-00000-of-00001.parquet`` (with pyarrow; otherwise
``DIR/videomme/test.json``, the same rows) and ``DIR/data/<videoID>.mp4``. Deterministic in
``seed``; existing videos are kept.
"""
from __future__ import annotations

import json
import pathlib
import random
from typing import Dict, Sequence

DURATIONS = {"short": 16, "medium": 32, "long": 64}
TASK_TYPES = {"object_shape": "Object Recognition", "absent_color": "Object Reasoning",
              "background": "Attribute Perception"}


def make_synthetic(out_dir, videos_per_split: int = 4, seed: int = 0) -> Dict[str, object]:
    """Write the benchmark; returns {"data": file, "videos": dir, "questions": n}."""
    from ..data import synthetic_videos
    from .benchmarks import LETTERS
    if videos_per_split < 1:
        raise ValueError(f"--videos-per-split: expected >= 1, got {videos_per_split}")
    out = pathlib.Path(out_dir)
    vdir = out / "data"
    vdir.mkdir(parents=True, exist_ok=True)
    rows, num_videos = [], 0
    for split, T in DURATIONS.items():
        rng = random.Random(f"videomme-synthetic-{seed}-{split}")
        k = T // 16
        for i in range(videos_per_split):
            spec = synthetic_videos.sample_spec(rng, num_frames=T, n_target=(2 * k, 3 * k),
                                                n_distractor=(3 * k, 6 * k))
            vid = f"syn_{split}_{i:03d}"
            num_videos += 1
            path = vdir / f"{vid}.mp4"
            if not path.is_file():
                synthetic_videos.make_video(str(path), spec)
            for j, q in enumerate(synthetic_videos.questions(spec, rng)):
                choices = sorted(synthetic_videos.BACKGROUNDS) if q["category"] == "background" \
                    else list(synthetic_videos.SHAPES) + [synthetic_videos.ABSENT_ANSWER]
                rng.shuffle(choices)
                rows.append({
                    "video_id": f"{num_videos:03d}", "duration": split,
                    "domain": "Synthetic", "sub_category": q["category"],
                    "url": "", "videoID": vid, "question_id": f"{vid}-{j + 1}",
                    "task_type": TASK_TYPES[q["category"]], "question": q["question"],
                    "options": [f"{LETTERS[n]}. {c}" for n, c in enumerate(choices)],
                    "answer": LETTERS[choices.index(q["answer"])],
                })
    bdir = out / "videomme"
    bdir.mkdir(parents=True, exist_ok=True)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
        data = bdir / "test-00000-of-00001.parquet"
        pq.write_table(pa.Table.from_pylist(rows), str(data))
    except ImportError:
        data = bdir / "test.json"
        data.write_text(json.dumps(rows, indent=1) + "\n")
    return {"data": str(data), "videos": str(vdir), "questions": len(rows),
            "num_videos": num_videos}


# The quick path's settings for the tiny model, as in scripts/tiny/eval_tiny.sh: 16 frames (its
# training length), two budgets, and the tiny model's answer format -- it answers with the
# option's text ("circle"), not a letter, and was trained on the bare question (the defaults,
# lmms-eval's lettered prompt and letter parsing, would score every answer as unanswered).
# The default methods at these settings make 15 rows; 48 questions (the default
# --videos-per-split 4) took 85-135 s on 2 CPU cores (studies/results/eval_synthetic_quick).
QUICK_EVAL_FLAGS = ("--frames", "16", "--budgets", "1024,2048", "--prompt-style", "bare",
                    "--answer-mode", "option-text", "--max-new-tokens", "8")


def quick_eval_answers(questions: int) -> int:
    """How many answers the quick command makes (the default methods, budgeted ones twice)."""
    from .methods import DEFAULT_METHODS, parse_methods
    budgets = len(QUICK_EVAL_FLAGS[QUICK_EVAL_FLAGS.index("--budgets") + 1].split(","))
    return questions * sum(budgets if m.budgeted else 1
                           for m in parse_methods(DEFAULT_METHODS, {}))


def quick_eval_argv(info: Dict[str, object], out_dir) -> list:
    """The ``videorouter eval`` arguments that evaluate the tiny model on a benchmark written
    by :func:`make_synthetic` (``info`` its return value), results in ``OUT_DIR/eval``."""
    return ["--benchmark", "videomme", "--data", str(info["data"]), "--videos",
            str(info["videos"]), *QUICK_EVAL_FLAGS, "--out", str(pathlib.Path(out_dir) / "eval")]


def make_random_clip(out_dir, seed: int = 0) -> str:
    """A tiny *random-weight* CLIPModel (config only, nothing downloaded) with the tiny
    tokenizer, saved like a real checkpoint: the stand-in for ``--clip`` in tests and in the
    synthetic table (no pretrained CLIP can be fetched here; its scores carry no meaning, so
    the ``clip`` row of a table made with it measures the plumbing, not CLIP)."""
    import torch
    from transformers import CLIPConfig, CLIPModel

    from ..backbones.tiny import load_tiny_tokenizer
    tok = load_tiny_tokenizer()
    cfg = CLIPConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=64,
                         eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                         pad_token_id=tok.pad_token_id),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, image_size=64, patch_size=16),
        projection_dim=16)
    torch.manual_seed(seed)
    CLIPModel(cfg).eval().save_pretrained(str(out_dir), safe_serialization=True)
    tok.save_pretrained(str(out_dir))
    return str(out_dir)


# The needle task (``--make-synthetic DIR --synthetic-task needle``): clips of 5 to 20 minutes,
# three 2-second events each (vr_runtime.data.needle_videos), one question an event, read by the
# generic ``jsonl`` benchmark. The methods compared at one budget and four frame counts: the
# paper's auto, fragment, uniform and global, the long-prompt auto (the tiny model's 16-frame
# cap, without and with the neighbours' middle window), and ``budget``: every frame at full
# resolution, as many frames as the budget holds (dense at the frames that fit; 16 at 4,096). A
# clip's three questions are answered in one batch (the same predictions as one by one).
NEEDLE_MINUTES = (5.0, 20.0)
NEEDLE_METHODS = "auto,auto-long-16,auto-long-16-mid,fragment,uniform,global,budget"
NEEDLE_EVAL_FLAGS = ("--methods", NEEDLE_METHODS, "--frames", "64,256,1024,2048", "--budgets",
                     "4096", "--prompt-style", "bare", "--answer-mode", "option-text",
                     "--max-new-tokens", "8", "--batch-size", "3")


def make_needle(out_dir, videos: int = 6, seed: int = 0,
                minutes: Sequence[float] = NEEDLE_MINUTES) -> Dict[str, object]:
    """Write ``videos`` needle clips (lengths drawn uniformly in ``minutes``) to ``DIR/data``
    and their questions to ``DIR/needle.jsonl``; returns {"data", "videos", "questions",
    "num_videos"}. Deterministic in ``seed``; existing videos are kept."""
    from ..data import needle_videos as N
    lo, hi = (float(m) for m in minutes)
    if videos < 1:
        raise ValueError(f"--videos-per-split: expected >= 1, got {videos}")
    if not 0 < lo <= hi:
        raise ValueError(f"--needle-minutes: expected 0 < LO <= HI, got {lo:g},{hi:g}")
    out = pathlib.Path(out_dir)
    vdir = out / "data"
    vdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(videos):
        rng = random.Random(f"needle-{seed}-{i}")
        spec = N.sample_needle(rng, 60.0 * rng.uniform(lo, hi))
        vid = f"needle_{i:03d}"
        path = vdir / f"{vid}.mp4"
        if not path.is_file():
            tmp = path.with_suffix(".part.mp4")
            N.write_needle_video(str(tmp), spec)
            tmp.replace(path)
        minutes_label = f"{spec.duration_s / 60:.0f}min"
        for j, q in enumerate(spec.questions()):
            options = list(N.OPTIONS)
            rng.shuffle(options)
            rows.append({"id": f"{vid}-{j + 1}", "video": path.name, "question": q["question"],
                         "options": options, "answer": q["answer"], "category": "needle",
                         "duration": minutes_label, "event_s": [q["start_s"], q["end_s"]]})
    data = out / "needle.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"data": str(data), "videos": str(vdir), "questions": len(rows),
            "num_videos": videos}


def needle_eval_argv(info: Dict[str, object], out_dir) -> list:
    """The ``videorouter eval`` arguments of the needle benchmark written by
    :func:`make_needle`, results in ``OUT_DIR/eval``."""
    return ["--benchmark", "jsonl", "--data", str(info["data"]), "--videos", str(info["videos"]),
            *NEEDLE_EVAL_FLAGS, "--out", str(pathlib.Path(out_dir) / "eval")]


__all__ = ["make_synthetic", "make_random_clip", "quick_eval_argv", "quick_eval_answers",
           "QUICK_EVAL_FLAGS", "DURATIONS", "make_needle", "needle_eval_argv",
           "NEEDLE_EVAL_FLAGS", "NEEDLE_METHODS", "NEEDLE_MINUTES"]
