#!/usr/bin/env bash
# Everything the CPU test suite needs, on a fresh Debian/Ubuntu machine with Python 3.10+:
#   * Debian's ffmpeg: the video corpus tests make their files with it and compare against its
#     decode; and Debian's chromium and chromium-driver: the HTML pages' browser tests drive them
#     (each installed with apt-get when missing; needs root or sudo);
#   * PyTorch 2.13.0's CPU build first, so nothing later pulls a CUDA build. PyPI's torch for
#     Linux is the CUDA build (several GB of cuda-toolkit, cuDNN and NCCL wheels); the CPU build
#     (2.13.0+cpu) comes from PyTorch's CPU wheel index, as PyTorch's install page gives it.
#     VR_TORCH_INDEX names another index (a mirror); VR_TORCH_INDEX= (empty) uses pip's own;
#   * lmms-eval 0.7.3 without its own requirements (they pull torchvision, which replaces the CPU
#     torch with a CUDA build): the plugin test runs against the real package, and the `lmms`
#     extra brings the packages its import path needs;
#   * the project with its test, serving, Ray, evaluation and lmms extras.
# Every package but torch is held at requirements/test-lock.txt (pip constraints), so an upstream
# release changes nothing here until scripts/ci/lock.sh is rerun. pip's own output goes to a log
# file; this prints a line a step, and the log's tail when a step fails.
# README.md's test command runs this, then pytest; .ci/run runs that same command.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
LOCK=requirements/test-lock.txt
LOG="${TMPDIR:-/tmp}/videorouter-setup-tests.log"
: > "$LOG"

step() {  # step DESCRIPTION COMMAND...: one line, pip's output in the log
    local what="$1"; shift
    printf '%s ... ' "$what"
    local t0=$SECONDS
    if "$@" >>"$LOG" 2>&1; then
        echo "ok ($((SECONDS - t0)) s)"
    else
        echo "FAILED"
        echo "--- the last lines of $LOG:"
        tail -n 40 "$LOG"
        exit 1
    fi
}

# Debian's packages, each only when missing, in one apt-get update: ffmpeg and ffprobe for the
# video tests; Chromium and its chromedriver for the HTML pages' browser tests (tests/html/, driven
# by selenium from the test extra; without them those tests skip with one line).
APT=()
{ command -v ffmpeg && command -v ffprobe; } >/dev/null || APT+=(ffmpeg)
{ command -v chromedriver && { command -v chromium || command -v chromium-browser; }; } \
    >/dev/null || APT+=(chromium chromium-driver)
if [ ${#APT[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    step "Debian's ${APT[*]} (the video tests, the pages' browser tests)" \
        bash -c "$SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends ${APT[*]}"
fi

cpu_torch() {  # is the CPU build of torch 2.13.0 what python3 imports?
    python3 - <<'PY' 2>/dev/null
import sys, torch
sys.exit(not (torch.__version__.split("+")[0] == "2.13.0" and torch.version.cuda is None))
PY
}
if cpu_torch; then
    echo "torch 2.13.0 (CPU build) ... already installed"
else
    TORCH_INDEX="${VR_TORCH_INDEX-https://download.pytorch.org/whl/cpu}"
    # --extra-index-url: 2.13.0+cpu sorts above PyPI's 2.13.0, so pip takes the CPU wheel.
    step "torch 2.13.0, CPU build${TORCH_INDEX:+ (from $TORCH_INDEX)}" \
        python3 -m pip install torch==2.13.0 ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"}
fi
if ! cpu_torch; then
    python3 -c "import torch; print(f'torch {torch.__version__} (CUDA {torch.version.cuda}) is installed here')" 2>&1 || true
    echo "The CPU test suite needs torch 2.13.0's CPU build (torch.version.cuda is None). Use a fresh" \
         "virtual environment, or: python3 -m pip install --force-reinstall torch==2.13.0" \
         "--index-url https://download.pytorch.org/whl/cpu"
    exit 1
fi

echo "lmms-eval 0.7.3 goes in without its own requirements (torchvision, wandb, av<16, zss, ...:" \
     "they would replace the CPU torch); pip's warnings about them are expected and kept in $LOG"
step "lmms-eval 0.7.3" python3 -m pip install --no-deps -c "$LOCK" "lmms-eval==0.7.3"
step "the project with its dev, serve, ray, eval and lmms extras (held at $LOCK)" \
    python3 -m pip install -c "$LOCK" -e ".[dev,serve,ray,eval,lmms]"
python3 - <<'PY'
import importlib.metadata as md
import torch, lmms_eval  # noqa: F401  (both must import)
assert torch.version.cuda is None, torch.version.cuda
print(f"ready: torch {torch.__version__}, transformers {md.version('transformers')}, "
      f"triton {md.version('triton')}, lmms-eval {md.version('lmms-eval')}")
PY
