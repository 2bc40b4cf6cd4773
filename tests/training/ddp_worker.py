"""One rank of the 2-process gloo test (launched by test_distributed.py through torchrun)."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from safetensors.torch import save_file  # noqa: E402

from stage_helpers import stage_config  # noqa: E402
from vr_runtime.training.loop import train  # noqa: E402


def main():
    data, out, routers = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    cfg = stage_config(1, data, os.path.join(out, "run"), routers=routers, max_steps=2,
                       per_device_train_batch_size=1)
    res = train(cfg, progress=False, evaluate=False)
    rank = int(os.environ["RANK"])
    trainee = res["trainee"]
    state = {k: v.detach().contiguous() for k, v in trainee.routers.state_dict().items()}
    save_file(state, os.path.join(out, f"rank{rank}.safetensors"))
    import torch.distributed as dist
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"num_processes": res["num_processes"], "backend": dist.get_backend(),
                   "steps": res["global_step"]}, f)


if __name__ == "__main__":
    main()
