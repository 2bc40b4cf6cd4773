"""The benchmark suite: one short script a benchmark over one shared harness.

``bench.harness`` (environment, the timer, tables, results files, fresh processes, targets),
``bench.scripts`` (one benchmark each, run from the repository root as
``python -m bench.scripts.bench_<name>``), ``bench.models`` (what the end-to-end benchmarks
build), ``bench.report`` (results into text). README.md says where each thing is.
"""
