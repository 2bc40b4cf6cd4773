"""Turning results into text: the end-to-end tables and plot, the pool_pack page, the GPU run's
summary, and pytest-benchmark's JSON as a markdown table. The shared table helpers are
bench.harness.tables."""
