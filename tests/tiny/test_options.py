"""The tiny options live in a stage config's ``tiny`` section (vr_tiny/options.py): every
committed config reads as it did, and an old config or an override that still names one at the
top level gets one line with its new place."""
import json

import pytest

from tiny_helpers import flat
from vr_runtime.training.config import ConfigError, load_config
from vr_tiny import CONFIGS, TinyOptions, set_option, tiny_options


def test_an_old_config_names_the_new_key_in_one_line(tmp_path):
    d = json.loads((CONFIGS / "tiny_stage3d.json").read_text())
    old = {**{k: v for k, v in d.items() if k != "tiny"}, **d["tiny"]}   # the keys on top
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(ConfigError) as e:
        load_config(str(tmp_path / "old.json"))
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and msg.startswith("dense_plan_prob moved to "
                                                         "tiny.dense_plan_prob: "), msg
    moved = {k: old.pop(k) for k in d["tiny"]}      # the same keys, moved: the same config
    (tmp_path / "new.json").write_text(json.dumps(old))
    assert flat(load_config(str(tmp_path / "new.json"), tiny=moved)) == \
        flat(load_config("tiny_stage3d"))


def test_the_stage_command_names_the_new_key_of_an_override(capsys, tmp_path):
    from vr_tiny.__main__ import main
    assert main(["stage", "--config", "tiny_stage3", "--set", "caption_turn_prob=0.5",
                 f"output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: caption_turn_prob moved to tiny.caption_turn_prob: "
                   "--set tiny.caption_turn_prob=VALUE"]


def test_options_in_their_section_and_off_without_one():
    cfg = load_config("tiny_stage3e")
    assert cfg.extensions["tiny"].route_weight == 1.0 and cfg.to_dict()["tiny"]["route_weight"]
    plain = load_config("tiny_stage3")
    assert plain.extensions == {} and tiny_options(plain) == TinyOptions()
    set_option(plain, "caption_turn_prob", 0.5)
    set_option(plain, "learning_rate", 1e-3)
    assert plain.extensions["tiny"].caption_turn_prob == 0.5 and plain.learning_rate == 1e-3
    with pytest.raises(ConfigError, match="^tiny.caption_turn_prob: a caption replaces"):
        plain.validate()


def test_no_tiny_key_is_left_on_top():
    from dataclasses import fields
    from vr_runtime.training.config import TrainConfig
    assert not {f.name for f in fields(TrainConfig)} & {f.name for f in fields(TinyOptions)}
    for path in CONFIGS.glob("tiny_stage[1-3]*.json"):
        top = set(json.loads(path.read_text()))
        assert not top & {f.name for f in fields(TinyOptions)}, path.name
