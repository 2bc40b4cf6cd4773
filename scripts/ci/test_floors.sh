#!/usr/bin/env bash
# The declared dependency floors, proven: installs the oldest versions pyproject.toml allows of
# the libraries the backbones lean on (transformers, tokenizers, accelerate, safetensors, triton,
# with the CPU torch 2.13.0 the main test environment uses) into a virtual environment of its
# own, installs the project into it, and runs the backbone-equivalence and runtime tests there.
# The interpreter that runs this script is never touched: everything goes into the venv.
#
#   bash scripts/ci/test_floors.sh            # venv in ${TMPDIR:-/tmp}/videorouter-floors (kept, reused)
#   VR_FLOORS_VENV=/some/dir bash scripts/ci/test_floors.sh
#
# .ci/run runs it after the main test command. Raise a floor here and in pyproject.toml together.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

# The floors (pyproject.toml's lower bounds). huggingface_hub is transformers' own requirement
# (>=1.5.0 for 5.5.4), and tokenizers 0.22.0 requires huggingface_hub<1.0, so 0.22.1 is the
# oldest tokenizers any transformers 5.x can be installed with.
FLOORS=(
    "transformers==5.5.4"
    "huggingface_hub==1.5.0"
    "tokenizers==0.22.1"
    "accelerate==1.1.0"
    "safetensors==0.4.3"
    "triton==3.6.0"
)
TESTS=(
    tests/backbones/test_qwen2_5_vl.py
    tests/backbones/test_qwen3_vl.py
    tests/backbones/test_qwen3_5.py
    tests/backbones/test_internvl3_5.py
    tests/backbones/test_model.py
    tests/runtime/test_runtime.py
    tests/backbones/test_backbones_e2e.py
)

VENV="${VR_FLOORS_VENV:-${TMPDIR:-/tmp}/videorouter-floors}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
# The CPU torch first (as scripts/ci/setup_tests.sh does), so nothing later pulls a CUDA build.
"$PY" -m pip install -q torch==2.13.0
# The floors, and every other package at its version in the test lock (requirements/
# test-lock.txt), so that this leg, like the main one, moves only when the lock does.
printf '%s\n' "${FLOORS[@]}" > "$VENV/floors.txt"
FLOOR_NAMES="$(printf '%s\n' "${FLOORS[@]}" | sed -e 's/==.*//' -e 's/[-_]/[-_]/g' | paste -sd'|')"
grep -E '^[A-Za-z0-9]' requirements/test-lock.txt | grep -viE "^($FLOOR_NAMES)==" >> "$VENV/floors.txt"
# The project with its declared requirements, each of the above held at its floor (-c): pip
# fails here if a floor no longer satisfies another requirement.
"$PY" -m pip install -q -c "$VENV/floors.txt" -e . "pytest>=8" pytest-timeout "${FLOORS[@]}"
"$PY" - "${FLOORS[@]}" <<'EOF'
import sys
from importlib.metadata import version
import torch
assert torch.__version__.startswith("2.13.0"), torch.__version__
for req in sys.argv[1:]:
    name, want = req.split("==")
    got = version(name)
    assert got == want, f"{name}: {got} installed, floor is {want}"
print("floors:", ", ".join(sys.argv[1:]), "| torch", torch.__version__)
EOF
TRITON_INTERPRET=1 "$PY" -m pytest -m "not gpu" -q -p no:cacheprovider "${TESTS[@]}"
