"""pytest setup of the kernel benchmarks under bench/ (``pytest bench/ --benchmark-only``).

Not part of the test suite: ``testpaths = ["tests"]`` keeps ``pytest -m "not gpu"`` out of
this folder; tests/bench/test_pool_pack_benchmark_smoke.py runs the benchmark file once,
untimed, so it cannot rot.
"""
import pytest
import torch


def pytest_addoption(parser):
    parser.addoption("--bench-compile", action="store_true", default=False,
                     help="also time torch.compile of the reference where it is skipped by "
                          "default (every sweep shape on a GPU, every shape on the CPU, where "
                          "compiling takes 4-35 s a shape)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (the Triton rows are -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_benchmark_update_machine_info(config, machine_info):
    """What a saved run must name beside pytest-benchmark's own machine info: the device the
    figures are for (a CPU run says CPU), the date and the library versions."""
    from bench.harness.env import environment
    env = environment()
    machine_info["videorouter"] = dict(
        label="GPU" if torch.cuda.is_available() else "CPU",
        device=env["device"], date_utc=env["date_utc"], torch=env["torch"],
        triton=env["triton"], cuda=env["cuda"], python=env["python"],
        torch_threads=torch.get_num_threads(), load_avg_1m=env.get("load_avg_1m"))
