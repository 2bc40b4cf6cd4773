#!/usr/bin/env bash
# The wheels the NVDEC decoder (--decoder torchcodec) needs on the GPU image, downloaded here into
# .whl/ (git-ignored) so they can travel with the working tree to a machine with no network
# (the device tool's carry: 64 MiB in all). torchcodec alone: the image has CUDA PyTorch
# (torch 2.11.0+cu130 on 2026-11-24); torchcodec >= 0.14 works with torch >= 2.11, and its
# Linux wheel on PyPI is the CUDA 13 build. --no-deps: nothing else comes, no other torch.
#
#   bash scripts/gpu/download_wheels.sh            # cp312 (the image's Python on 2026-11-24), ~10 MB
#   bash scripts/gpu/download_wheels.sh all        # cp310..cp313, ~40 MB
#
# On the device: python3 -m pip install --no-deps --no-index .whl/torchcodec-*-cp3XX-*.whl
# (docs/video-input.md; it also needs the system's FFmpeg 4-8 shared libraries to demux).
set -eu -o pipefail
cd "$(dirname "$0")/../.."
VERSION="${TORCHCODEC_VERSION:-0.17.0}"
case "${1:-312}" in
all) PYS=(310 311 312 313) ;;
310|311|312|313) PYS=("${1:-312}") ;;
*) echo "download_wheels.sh: expected all or one of 310 311 312 313, got '$1'" >&2; exit 2 ;;
esac
mkdir -p .whl
for py in "${PYS[@]}"; do
    python3 -m pip download --no-deps --only-binary=:all: --python-version "$py" \
        --platform manylinux_2_28_x86_64 "torchcodec==$VERSION" -d .whl
done
du -ch .whl/*.whl | tail -1
