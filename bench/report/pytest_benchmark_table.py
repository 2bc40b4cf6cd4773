"""A pytest-benchmark JSON of bench/test_pool_pack_benchmark.py as a markdown table.

    python -m bench.report.pytest_benchmark_table RUN.json [--out RUN.md]

One table a group (a shape and direction), a row a method: median and interquartile range in
ms, rounds, GB/s from the explicit byte count (``extra_info``) and the median relative to the
group's fastest PyTorch row; the header names the device label, date and versions the run
recorded (bench/conftest.py).
"""
from __future__ import annotations

import argparse
import json
from typing import Dict, List

from bench.harness.tables import markdown_grid

ORDER = ("triton", "torch", "compiled", "reference", "copy")


def table(run: dict) -> str:
    vr = run.get("machine_info", {}).get("videorouter", {})
    groups: Dict[str, List[dict]] = {}
    for b in run["benchmarks"]:
        groups.setdefault(b["group"], []).append(b)
    out = [f"# pool_pack, pytest-benchmark: {vr.get('label', '?')} figures", "",
           f"{vr.get('device', '?')}; {run.get('datetime', vr.get('date_utc', '?'))}; torch "
           f"{vr.get('torch')}, triton "
           f"{vr.get('triton')}, cuda {vr.get('cuda')}, Python {vr.get('python')}, "
           f"{vr.get('torch_threads')} torch thread(s), 1-min load average "
           f"{vr.get('load_avg_1m')}; pytest-benchmark {run.get('version')}.", "",
           "Median and IQR of the rounds in ms; GB/s at the median from the explicit byte "
           "count; *x torch*: median / the `torch` row's median.", ""]
    for name, rows in groups.items():
        rows.sort(key=lambda b: ORDER.index(b["extra_info"]["method"])
                  if b["extra_info"]["method"] in ORDER else len(ORDER))
        base = next((b["stats"]["median"] for b in rows if b["extra_info"]["method"] == "torch"),
                    None)
        cells = [[b["extra_info"]["method"], f"{b['stats']['median'] * 1e3:.4g}",
                  f"{b['stats']['iqr'] * 1e3:.3g}", str(b["stats"]["rounds"]),
                  f"{b['extra_info'].get('gbps', float('nan')):.3g}",
                  "-" if not base else f"{b['stats']['median'] / base:.2f}"] for b in rows]
        out += [f"## {name}", "", markdown_grid(["method", "median ms", "IQR ms", "rounds",
                                                "GB/s", "x torch"], cells, numbers_right=True),
                ""]
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run", help="a --benchmark-json file")
    p.add_argument("--out", default=None, help="write the markdown here (default: print it)")
    a = p.parse_args(argv)
    with open(a.run) as f:
        md = table(json.load(f))
    if a.out:
        with open(a.out, "w") as f:
            f.write(md)
        print(f"wrote {a.out}")
    else:
        print(md)


if __name__ == "__main__":
    main()
