#!/usr/bin/env bash
# FFmpeg's shared libraries for torchcodec (NVDEC decoding) on a machine that has none, taken
# from the PyAV wheel already installed there: manylinux wheels bundle FFmpeg under hashed names
# (av.libs/libavcodec-5e6b81c2.so.62.28.102), which the loader does not find by the sonames
# torchcodec asks for (libavcodec.so.62). This links each one under its plain soname in DIR:
#
#   eval "$(bash scripts/gpu/ffmpeg_from_pyav.sh [DIR])"    # default DIR: .ffmpeg
#
# prints the export of LD_LIBRARY_PATH (DIR first) for the shell to evaluate: the loader reads it
# when a process starts, so it must be set before python runs. PyAV 18 bundles FFmpeg 8
# (libavcodec 62: torchcodec's core8), PyAV 19 FFmpeg 9 (libavcodec 63: core9); the bundle is
# built with the CUDA hardware device (av.codec.hwaccel.hwdevices_available() lists 'cuda').
# The links point into site-packages, so nothing is copied and the carry stays as it was.
# Checked on CPU: every FFmpeg library of libtorchcodec_core8.so resolves (ldd), none missing.
set -eu -o pipefail
DIR="${1:-.ffmpeg}"
LIBS=$(python3 - <<'PY'
import pathlib, sys
try:
    import av
except ImportError:
    sys.exit("ffmpeg_from_pyav.sh: PyAV is not installed; install it first (.whl/)")
d = pathlib.Path(av.__file__).resolve().parent.parent / "av.libs"
if not d.is_dir():
    sys.exit(f"ffmpeg_from_pyav.sh: {d} is missing: this PyAV uses the system's FFmpeg")
print(d)
PY
)
mkdir -p "$DIR"
# Every bundled library by its own name too: FFmpeg's find theirs (libx264-d6533a8d.so.165, ...)
# through $ORIGIN, which the loader takes from the path it opened, the link's folder.
for f in "$LIBS"/*.so*; do
    ln -sfn "$f" "$DIR/$(basename "$f")"
done
n=0
for f in "$LIBS"/lib{avutil,avcodec,avformat,avdevice,avfilter,swscale,swresample}-*.so.*; do
    [ -e "$f" ] || continue
    base=$(basename "$f")                     # libavcodec-5e6b81c2.so.62.28.102
    name=${base%%-*}                          # libavcodec
    major=${base#*.so.}; major=${major%%.*}   # 62
    ln -sfn "$f" "$DIR/$name.so.$major"
    n=$((n + 1))
done
if [ "$n" -lt 7 ]; then
    echo "ffmpeg_from_pyav.sh: found $n of FFmpeg's 7 libraries in $LIBS" >&2
    exit 1
fi
echo "export LD_LIBRARY_PATH=\"$(cd "$DIR" && pwd)\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
