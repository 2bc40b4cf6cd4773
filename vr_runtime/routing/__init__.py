"""Routing: the Semantic Router (question -> policy) and the Image Router (frame relevance),
:mod:`.routers`; and the frame scorers a Fragment plan reads its decisions from,
:mod:`.scorers` (the Image Router, fixed decisions, and the paper's baselines)."""
