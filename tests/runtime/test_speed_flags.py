"""ask's and serve's speed flags (cli_args.add_speed_args): their choices are the runtime's, they
reach the VideoRouter, a mode the device cannot run is one line before the model loads, and
serve says at start-up what loading compiled."""
import argparse

import pytest
import torch

from vr_runtime import cli_args
from vr_runtime.backbones.compiled import COMPILE_CHOICES, CompileOptions
from vr_runtime.generate import DECODING_MODES


def test_choices_are_the_runtimes():
    assert cli_args.DECODING_CHOICES == DECODING_MODES
    assert cli_args.COMPILE_CHOICES == COMPILE_CHOICES


def parsed(*argv):
    p = argparse.ArgumentParser()
    cli_args.add_speed_args(p)
    return p.parse_args(list(argv))


def test_speed_options():
    kw = cli_args.speed_options(parsed("--decoding", "static", "--vision-compile", "inductor",
                                       "--compile-cache", "/tmp/x"), torch.device("cpu"))
    assert kw == {"decoding": "static",
                  "compile": CompileOptions(vision="inductor", router="auto", cache_dir="/tmp/x")}
    assert cli_args.speed_options(argparse.Namespace(), "cpu")["decoding"] == "auto"
    with pytest.raises(ValueError, match="--router-compile 'cudagraphs': CUDA graphs need a CUDA"):
        cli_args.speed_options(parsed("--router-compile", "cudagraphs"), torch.device("cpu"))


def test_ask_takes_them(cli_here):
    from vr_runtime.cli import SAMPLE_VIDEO
    import json
    r = cli_here("ask", SAMPLE_VIDEO, "What shape is the red object?", "--frames", "4",
                 "--max-length", "1400", "--max-new-tokens", "2", "--decoding", "static",
                 "--vision-compile", "off", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["report"]["decoding"] == "static"
    r = cli_here("ask", SAMPLE_VIDEO, "q?", "--decoding", "graph", "--device", "cpu")
    assert r.returncode == 2
    assert r.stderr.strip() == ("videorouter: error: decoding 'graph': CUDA graphs need a CUDA "
                                "device; use 'static' or 'dynamic' on cpu")


def test_serve_reports_what_loading_compiled():
    from vr_runtime.runtime import VideoRouter
    from vr_runtime.runtime.loading import warmup_line
    vr = VideoRouter.from_pretrained("tiny", warmup_frames=0, warm_request=False,
                                     compile=CompileOptions(vision="off", vision_chunk=4))
    from vr_runtime.runtime.loading import compiled_stages
    assert compiled_stages(vr) == []   # a fixed chunk, eager: nothing compiles
    line = warmup_line(vr)
    assert line.startswith("loaded: decoding dynamic, vision off (chunk 4), router off")
    assert line.endswith("no warm-up request")
    vr.compile_warmup["vision"] = {"mode": "inductor", "chunk": 16, "seconds": 12.34}
    vr.request_warmup = {"seconds": 1.5}
    assert "vision inductor (chunk 16, compiled in 12.3 s)" in warmup_line(vr)
    assert warmup_line(vr).endswith("warm-up request 1.5 s")


def test_serve_passes_them_to_the_engine():
    from vr_runtime import cli
    args = cli.build_parser().parse_args(["serve", "--media-dir", "/tmp", "--decoding", "static",
                                          "--router-compile", "inductor"])
    from vr_runtime.serve.command import configs
    engine = configs(args)[0]
    assert (engine.decoding, engine.router_compile, engine.vision_compile) == \
        ("static", "inductor", "auto")
