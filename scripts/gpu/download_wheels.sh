#!/usr/bin/env bash
# The wheels the GPU image lacks, downloaded here into .whl/ (git-ignored) so they can travel with
# the working tree to a machine with no network (the device tool's carry: 64 MiB in all): PyAV
# (a core dependency; the image had none on 2026-11-28, so every video import failed there) at
# the lock's version, and torchcodec for the NVDEC decoder (--decoder torchcodec). The image has
# CUDA PyTorch (torch 2.11.0+cu130 on 2026-11-24); torchcodec >= 0.14 works with torch >= 2.11,
# and its Linux wheel on PyPI is the CUDA 13 build. --no-deps: nothing else comes, no other torch.
#
#   bash scripts/gpu/download_wheels.sh        # cp312 (the image's Python on 2026-11-28), ~45 MB
#   bash scripts/gpu/download_wheels.sh all        # cp310..cp313: over the carry limit, pick one
#
# On the device: python3 -m pip install --no-deps --no-index .whl/*.whl
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
    case "$py" in 310) AV=17.1.0 ;; 311) AV=18.1.0 ;; *) AV=19.0.2 ;; esac   # the lock's
    python3 -m pip download --no-deps --only-binary=:all: --python-version "$py" \
        --platform manylinux_2_28_x86_64 "torchcodec==$VERSION" "av==${AV_VERSION:-$AV}" -d .whl
done
du -ch .whl/*.whl | tail -1
