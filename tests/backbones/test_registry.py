"""The backbone registry's tables without torch (what --help reads), the --model check, and
--device/--dtype resolution."""
import subprocess
import sys

import pytest
import torch

from vr_runtime import backbones
from vr_runtime.backbones.devices import device_dtype
from vr_runtime.errors import ModelFilesError


def test_the_tables_import_no_torch():
    code = ("import sys\n"
            "from vr_runtime.backbones import FAMILY_NAMES, MODEL_TYPES, PRESETS, families\n"
            "families()\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_every_family_has_a_name_and_every_preset_a_family():
    assert set(backbones.FAMILY_NAMES) == set(backbones.MODEL_TYPES)
    assert set(backbones.PRESETS.values()) <= set(backbones.MODEL_TYPES)
    text = backbones.families()
    assert all(t in text for t in backbones.MODEL_TYPES)


def test_the_interface_still_imports_from_the_package():
    from vr_runtime.backbones import Backbone, FrameSpec, VisionTokens
    from vr_runtime.backbones.base import Backbone as B
    assert Backbone is B and FrameSpec and VisionTokens
    with pytest.raises(AttributeError):
        backbones.NoSuchName


def test_check_model_arg_names_the_flag(tmp_path):
    backbones.check_model_arg("tiny")
    backbones.check_model_arg(tmp_path)
    with pytest.raises(ModelFilesError, match=r"^--model '.*nope': not a directory"):
        backbones.check_model_arg(str(tmp_path / "nope"))


def test_device_dtype():
    assert device_dtype("cpu", "fp32") == (torch.device("cpu"), torch.float32)
    assert device_dtype("cpu", None) == (torch.device("cpu"), torch.float32)
