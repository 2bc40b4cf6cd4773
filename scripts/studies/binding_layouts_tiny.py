"""Does the tiny answerer name the queried color's shape when the video's two targets differ in
shape? On the basic synthetic task's videos (``synth --task v1``: 16 frames, two targets,
small distractors), the greedy shape after the question "What shape is the {color} object?"
(``qa``) and after a caption prompt's color word (``caption``: ``layouts.CAPTION_QUESTION`` answered " {color}",
what a model trained with ``caption_turn_prob`` learned) and after the question answered by
its color word (``echo``: the question, answered " {color}", then the shape; never trained),
each split by whether the two targets share their shape, under three full-resolution layouts:
every frame (``dense``), only the targets' frames (``targets``), and one frame of each target
(``one_each``).

    python scripts/studies/binding_layouts_tiny.py --models tiny runs/X/hf [--videos 40] \
        [--out FILE]

Where the targets share a shape any reader is right; where they differ, a reader that does not
bind the color to its object is right about half the time.
"""
import argparse
import json
import random
import sys

import torch


def layouts(spec):
    """{name: plan} of the three layouts of ``spec``'s sampled frames."""
    T = spec.frames_sampled
    on = [[t for t, y in enumerate(spec.target_labels(c)) if y] for c, _ in spec.targets]
    both = {t for fs in on for t in fs}
    first = {fs[0] for fs in on if fs}
    return {"dense": [1] * T, "targets": [int(t in both) for t in range(T)],
            "one_each": [int(t in first) for t in range(T)]}


def greedy(bb, Z, plan, turn, n_extra: int, choices):
    """Index into ``choices`` (token ids) of the best next token after the prompt of ``turn``
    and the first ``n_extra`` tokens of its answer."""
    import vr_kernels
    from vr_runtime.training.stages import dialogue_sequence
    ids, n_prompt, dest, _, _ = dialogue_sequence(bb, [turn], plan)
    ids = ids[:n_prompt + n_extra]
    emb = bb.model.get_input_embeddings()(torch.tensor(ids))
    emb = vr_kernels.pool_pack(Z, plan, tuple(bb.grid), out=emb, dest=dest)
    h = bb.decoder()(inputs_embeds=emb[None], return_dict=True).last_hidden_state[0, -1]
    return int(bb.lm_head()(h)[choices].argmax())


@torch.no_grad()
def probe(model: str, videos: int) -> dict:
    from vr_runtime.backbones import load_backbone
    from vr_runtime.data import synthetic_videos as sv
    from vr_tiny.labeller import video_features
    from vr_tiny.layouts import CAPTION_QUESTION
    bb = load_backbone(model)
    tok, rng = bb.tokenizer, random.Random("binding-layouts")
    first = lambda w: tok(w, add_special_tokens=False)["input_ids"][0]   # noqa: E731
    qa_ids = [first(s) for s in sv.SHAPES]
    cap_ids = [first(" " + s) for s in sv.SHAPES]
    res: dict = {}
    for _ in range(videos):
        spec = sv.sample_spec(rng)
        Z = bb.project(video_features(bb, spec))
        kind = "two shapes" if len({s for _, s in spec.targets}) == 2 else "one shape"
        for name, plan in layouts(spec).items():
            for color, shape in spec.targets:
                want = sv.SHAPES.index(shape)
                got = {"qa": greedy(bb, Z, plan, (f"What shape is the {color} object?", shape),
                                    0, qa_ids),
                       "caption": greedy(bb, Z, plan, (CAPTION_QUESTION, " " + color), 1,
                                         cap_ids),
                       "echo": greedy(bb, Z, plan, (f"What shape is the {color} object?",
                                                    " " + color), 1, cap_ids)}
                for what, k in got.items():
                    cell = res.setdefault(name, {}).setdefault(what, {}).setdefault(kind, [0, 0])
                    cell[0] += int(k == want)
                    cell[1] += 1
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny"])
    ap.add_argument("--videos", type=int, default=40)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.videos < 1:
        sys.exit(f"--videos: expected >= 1, got {a.videos}")
    out = {"what": "[right, asked] per layout, reader (qa / caption / echo) and whether the two "
                   "targets share their shape", "command": "python " + " ".join(sys.argv),
           "videos": a.videos, "models": {m: probe(m, a.videos) for m in a.models}}
    print(json.dumps(out["models"], indent=1))
    if a.out:
        from vr_runtime.data.atomic import write_atomic
        write_atomic(a.out, json.dumps(out, indent=2))   # whole or not at all, even if killed


if __name__ == "__main__":
    main()
