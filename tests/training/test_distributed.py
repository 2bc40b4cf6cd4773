"""Distributed training works: two CPU processes on gloo run Stage 1 with DDP (accelerate) and
end with identical router parameters that differ from the start."""
import json
import os
import socket
import subprocess
import sys

import torch
from safetensors.torch import load_file

from vr_runtime.routing.routers import RouterConfig, Routers


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_gloo_stage1(tiny_data, tiny_lm, tmp_path):
    r0 = Routers.from_backbone(tiny_lm, RouterConfig(router_dim=32, num_heads=4, router_pool=2), seed=5)
    r0.save(tmp_path / "r0.safetensors")
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_worker.py")
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env.pop("TRITON_INTERPRET", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(_port()), worker,
           json.dumps(tiny_data), str(tmp_path), str(tmp_path / "r0.safetensors")]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=170)
    assert p.returncode == 0, p.stderr[-3000:]
    infos = [json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1)]
    assert all(i["num_processes"] == 2 and i["backend"] == "gloo" and i["steps"] == 2
               for i in infos)
    a, b = (load_file(str(tmp_path / f"rank{r}.safetensors")) for r in (0, 1))
    start = r0.state_dict()
    moved = 0
    for k in a:
        assert torch.equal(a[k], b[k]), k          # DDP kept the replicas in lockstep
        moved += int(not torch.equal(a[k], start[k]))
    assert moved > 0
    # only the Stage 1 groups moved (the Semantic Router is frozen)
    assert all(torch.equal(a[k], start[k]) for k in a if k.startswith("semantic."))
    assert not all(torch.equal(a[k], start[k]) for k in a if k.startswith("image."))
