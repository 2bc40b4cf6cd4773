"""--help is built from the registries (families, presets, policies, scorers, decoders), so a
registered name cannot go missing from it, and it stays light: no torch. The docs list the
same families and presets."""
import pathlib
import subprocess
import sys

import pytest

from vr_runtime import backbones, cli, cli_args

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _words(text: str) -> str:
    return " ".join(text.split())


def help_of(command: str) -> str:
    if command == "eval":
        from vr_runtime.eval.cli import build_parser
        return _words(build_parser().format_help())
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    return _words(sub.choices[command].format_help())


@pytest.mark.parametrize("command", ["ask", "serve", "eval"])
def test_every_registered_family_and_preset_is_in_help(command):
    text = help_of(command)
    missing = [t for t in backbones.MODEL_TYPES if t not in text]
    missing += [f"'{p}'" for p in backbones.PRESETS if f"'{p}'" not in text]
    assert not missing, f"{command} --help lacks {missing}"


def test_a_family_registered_later_shows_in_help(monkeypatch):
    # The help reads the registry when the parser is built: a new family needs no help edit.
    monkeypatch.setitem(backbones.MODEL_TYPES, "made_up_vl", "made_up:MadeUpBackbone")
    monkeypatch.setitem(backbones.PRESETS, "tiny-made-up", "made_up_vl")
    text = help_of("ask")
    assert "made_up_vl" in text and "'tiny-made-up'" in text


def test_every_policy_scorer_and_decoder_is_in_ask_help():
    from vr_runtime.planning.policies import policy_names
    from vr_runtime.routing.scorers import scorer_names
    from vr_runtime.video.decoders import DECODERS, SEEKS
    text = help_of("ask")
    for name in policy_names() + tuple(scorer_names()) + DECODERS + SEEKS:
        assert name in text, name


def test_the_decoder_choices_are_the_registry():
    from vr_runtime.video import decoders
    assert cli_args.DECODERS == decoders.DECODERS and cli_args.SEEKS == decoders.SEEKS


@pytest.mark.parametrize("argv", [["--help"], ["ask", "--help"], ["serve", "--help"]])
def test_help_imports_no_torch(argv):
    code = ("import sys\n"
            "from vr_runtime.cli import main\n"
            "try:\n"
            f"    main({argv!r})\n"
            "except SystemExit as e:\n"
            "    assert e.code == 0, e.code\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "usage: videorouter" in r.stdout


def test_the_docs_list_every_family_and_preset():
    # docs/answering.md is where the families and presets are documented; index.md links there
    # and names none itself, so it cannot go stale.
    answering = (ROOT / "docs" / "answering.md").read_text()
    missing = [t for t in backbones.MODEL_TYPES if f"`{t}`" not in answering]
    missing += [p for p in backbones.PRESETS if f"`{p}`" not in answering]
    assert not missing, f"docs/answering.md lacks {missing}"
    index = (ROOT / "docs" / "index.md").read_text()
    assert "answering.md#" in index
    for name in ("Qwen2.5-VL", "InternVL3 and"):
        assert name not in index, f"docs/index.md names a family ({name}); link the table instead"
