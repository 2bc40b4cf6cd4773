#!/usr/bin/env bash
# Everything the CPU test suite needs, on a fresh Debian/Ubuntu machine with Python 3.10+:
#   * Debian's ffmpeg: the video corpus tests make their files with it and compare against its
#     decode (installed with apt-get when missing; needs root or sudo);
#   * the CPU torch 2.13.0 first, so nothing later pulls a CUDA build;
#   * lmms-eval 0.7.3 without its own requirements (they pull torchvision, which replaces the CPU
#     torch with a CUDA build): the plugin test runs against the real package, and the `lmms`
#     extra brings the few packages its import path needs;
#   * the project with its test, serving, Ray, evaluation and lmms extras.
# README.md's test command runs this, then pytest; .ci/run runs that same command.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
if ! command -v ffmpeg >/dev/null || ! command -v ffprobe >/dev/null; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends ffmpeg >/dev/null
fi
python3 -m pip install torch==2.13.0
python3 -m pip install --no-deps "lmms-eval==0.7.3"
python3 -m pip install -e ".[dev,serve,ray,eval,lmms]"
python3 -c "import torch, lmms_eval; assert torch.__version__.startswith('2.13.0'), torch.__version__"
