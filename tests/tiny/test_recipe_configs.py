"""Every stage config the recipes build (``recipe._stage_config``, what ``train_tiny.sh
--task vN`` trains) is the one they built before the tiny options moved to a section of their
own: ``recipe_configs.json`` holds each recipe's stages as they were (flattened, paths under a
temporary folder as ``<tmp>``), and each is rebuilt and compared key for key."""
import dataclasses
import json
import pathlib

import pytest

from tiny_helpers import flat
from vr_tiny import recipe
from vr_tiny.pretrain import PretrainConfig

WANT = json.loads((pathlib.Path(__file__).parent / "recipe_configs.json").read_text())


def _lines(n: int) -> str:
    return "".join(json.dumps({"id": f"train_v2_{i:05d}_0", "video": f"train/train_v2_{i:05d}.mp4",
                               "conversations": [{"from": "human", "value": "<video>\nQ?"},
                                                 {"from": "gpt", "value": "circle"}]}) + "\n"
                   for i in range(n))


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipe")
    for folder in ("data", "data_more"):
        (root / "w" / folder / "train").mkdir(parents=True)
        (root / "w" / folder / "train_conversations.jsonl").write_text(_lines(2))
    return root


@pytest.mark.parametrize("task", ["v1", "v2", "v3", "v4", "v5", "v6", "v8", "v9"])
def test_each_stage_config_is_as_before(task, work):
    w = work / "w"
    stages = (1, 2, 3, "3b") + recipe.LATER_STAGES.get(task, ())
    for stage in stages:
        cfg = recipe._stage_config(stage, str(w / "data"), str(w), "BASE", "PREV", task)
        got = json.loads(json.dumps(flat(cfg)).replace(str(work), "<tmp>"))
        assert got == WANT[f"{task}/stage{stage}"], (task, stage)
    name = recipe.STAGE0_CONFIGS.get(task, "tiny_stage0")
    stage0 = {"name": name, **dataclasses.asdict(PretrainConfig.load(name))}
    assert json.loads(json.dumps(stage0)) == WANT[f"{task}/stage0"]
    assert sum(k.startswith(f"{task}/") for k in WANT) == len(stages) + 1
