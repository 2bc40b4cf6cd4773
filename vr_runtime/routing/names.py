"""The frame scorers ``--scorer`` accepts, with a few words each, importable without the scorers
(which import torch), so ``--help`` lists them at once. ``routing.scorers`` registers each;
tests/routing/test_scorer_names.py holds the two equal."""

DEFAULT_SCORER = "image-router"
SCORER_NAMES = {
    DEFAULT_SCORER: "the paper's Image Router",
    "clip": "CLIP relevance pooling, token-matched",
    "clip-fill": "CLIP top frames until the budget is full",
}
