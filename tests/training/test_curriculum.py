"""The trainer's seams for a curriculum beyond the paper's (vr_runtime/training/curriculum.py):
an extension's options are a section of the stage config, checked with the paper's keys; a key
of a section at the top level is one line naming its place; a config without a section trains
the paper's curriculum. A stand-in extension, registered for each test."""
import json
from dataclasses import dataclass, field
from typing import List

import pytest

from vr_runtime.training import curriculum
from vr_runtime.training.config import ConfigError, load_config


@dataclass
class Opts:
    rate: float = 0.0
    sizes: List[int] = field(default_factory=lambda: [1, 2])

    def validate(self):
        if not 0 <= self.rate <= 1:
            raise ConfigError(f"rate: expected in [0, 1], got {self.rate}")
        return self


class Mine(curriculum.Curriculum):
    def answer_text(self, question, answer):
        return f"{answer}!" if self.options.rate else answer


@pytest.fixture
def ext(monkeypatch):
    monkeypatch.setitem(curriculum.EXTENSIONS, "mine",
                        curriculum.Extension("mine", Opts, Mine))
    return curriculum.EXTENSIONS["mine"]


def _file(tmp_path, **keys):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"stage": 3, "output_dir": "o", **keys}))
    return str(p)


def test_a_section_becomes_its_options_and_overrides_merge_into_it(ext, tmp_path):
    cfg = load_config(_file(tmp_path, mine={"rate": 0.5}), **{"mine.sizes": [3]})
    assert cfg.extensions["mine"] == Opts(rate=0.5, sizes=[3])
    assert cfg.to_dict()["mine"] == {"rate": 0.5, "sizes": [3]} and "extensions" not in cfg.to_dict()
    again = load_config(_file(tmp_path), **cfg.to_dict())          # the dict round-trips
    assert again.extensions == cfg.extensions
    assert type(curriculum.curriculum_for(cfg)) is Mine
    assert curriculum.curriculum_for(cfg).answer_text("q", "a") == "a!"


def test_without_a_section_the_paper_curriculum(ext):
    cfg = load_config("stage3")
    assert cfg.extensions == {} and "mine" not in cfg.to_dict()
    c = curriculum.curriculum_for(cfg)
    assert type(c) is curriculum.Curriculum and not c.siblings
    assert (c.answer_text("q", "a"), c.extra_losses(None), c.frozen(None)) == ("a", [], [])


@pytest.mark.parametrize("keys,over,msg", [
    ({"rate": 0.5}, {}, r"^rate moved to mine\.rate: put it in the \"mine\" section of "),
    ({}, {"rate": 0.5}, r"^rate moved to mine\.rate: --set mine\.rate=VALUE$"),
    ({"mine": {"rat": 0.5}}, {}, r"mine: unknown keys \['rat'\] \(did you mean 'rate'\?\)"),
    ({"mine": {"rate": 2.0}}, {}, r"^mine\.rate: expected in \[0, 1\], got 2\.0$"),
    ({"mine": {"rate": "x"}}, {}, r"^mine\.rate: expected a finite number, got 'x'$"),
    ({"mine": 1}, {}, r"mine: expected a section"),
    ({}, {"yours.rate": 1}, r"yours: no such section \(registered: mine"),
])
def test_a_bad_section_key_is_one_line(ext, tmp_path, keys, over, msg):
    with pytest.raises(ConfigError, match=msg) as e:
        load_config(_file(tmp_path, **keys), **over)
    assert len(str(e.value).splitlines()) == 1


def test_one_section_at_most(ext, monkeypatch, tmp_path):
    monkeypatch.setitem(curriculum.EXTENSIONS, "other",
                        curriculum.Extension("other", Opts, Mine))
    with pytest.raises(ConfigError, match="mine, other: one curriculum section at most"):
        load_config(_file(tmp_path, mine={}, other={}))


def test_an_unregistered_section_names_what_is_registered(ext, tmp_path):
    with pytest.raises(ConfigError, match=r"nobody: a section of no registered curriculum "
                                          r"\(registered: mine"):
        load_config(_file(tmp_path, nobody={"rate": 1}))
