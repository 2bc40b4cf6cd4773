"""``videorouter serve``'s parser on its own (vr_runtime.serve.command.serve_parser), as the Ray
Serve builder uses it, and add_serve_parser."""
import argparse

import pytest

from vr_runtime.serve.command import add_serve_parser, serve_parser


def test_serve_parser_reads_what_the_videorouter_command_reads(tmp_path):
    from vr_runtime.cli import build_parser
    argv = ["serve", "--media-dir", str(tmp_path), "--frames", "8", "--scales", "auto",
            "--max-batch", "2", "--policy", "fragment"]
    assert vars(serve_parser().parse_args(argv)) == vars(build_parser().parse_args(argv))
    args = serve_parser().parse_args(["serve", "--media-dir", str(tmp_path)])
    assert (args.command, args.frames, args.max_length, args.max_new_tokens, args.policy,
            args.scales, args.device, args.dtype) == ("serve", 64, 12288, 64, "auto", (2, 1, 4),
                                                      None, None)


def test_serve_parser_refuses_a_bad_value_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        serve_parser().parse_args(["serve", "--media-dir", str(tmp_path), "--frames", "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "--frames" in err


def test_add_serve_parser_takes_the_subcommands_only():
    sub = argparse.ArgumentParser().add_subparsers(dest="command")
    assert add_serve_parser(sub).parse_args(["--media-dir", "."]).frames == 64
    with pytest.raises(TypeError):
        add_serve_parser(sub, None, "auto|...", ("fp32",))


def test_ray_app_parses_through_serve_command_not_the_cli():
    import ast
    import pathlib

    import vr_runtime.serve.ray_app as ray_app
    tree = ast.parse(pathlib.Path(ray_app.__file__).read_text())
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "cli" not in modules and "command" in modules
