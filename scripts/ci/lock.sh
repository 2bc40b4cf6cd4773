#!/usr/bin/env bash
# Regenerates requirements/test-lock.txt: the exact version of every package that the test
# command (scripts/ci/setup_tests.sh) installs beside the pinned CPU torch, resolved for every
# Python the project supports (3.10+) and every platform, with uv's universal resolver.
#
#   bash scripts/ci/lock.sh          # then run the tests, and commit the lock with what it fixed
#
# setup_tests.sh installs with the lock as a pip constraints file (-c), so a new upstream release
# reaches the test environment only through this command. To see which newest releases break the
# suite before locking them in, run scripts/ci/check_drift.sh.
#
# Versions only, no hashes: pip's hash-checking mode refuses editable installs (the test command
# installs the project with -e) and would need a hash for torch, whose CPU wheel comes from
# another index than PyPI's CUDA one.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

UV="$(command -v uv || true)"
if [ -z "$UV" ]; then
    # uv in a virtual environment of its own, so the interpreter running this is not touched.
    TOOLS="${TMPDIR:-/tmp}/videorouter-lock-tools"
    [ -x "$TOOLS/bin/uv" ] || { python3 -m venv "$TOOLS" && "$TOOLS/bin/python" -m pip install -q uv; }
    UV="$TOOLS/bin/uv"
fi

TORCH_PIN="$(mktemp)"
trap 'rm -f "$TORCH_PIN"' EXIT
echo "torch==2.13.0" > "$TORCH_PIN"   # the same pin as setup_tests.sh

# The extras are setup_tests.sh's; requirements/uv.toml gives torch the CPU wheel's requirements.
"$UV" pip compile pyproject.toml \
    --extra dev --extra serve --extra ray --extra eval --extra lmms \
    --universal --python-version 3.10 \
    --config-file requirements/uv.toml -c "$TORCH_PIN" \
    --no-header --quiet -o requirements/test-lock.txt.new
{
    echo "# The test environment's lock: pip constraints for scripts/ci/setup_tests.sh."
    echo "# Made by scripts/ci/lock.sh ($("$UV" --version)) on $(date -u +%Y-%m-%d); do not edit by hand."
    echo "#"
    echo "# lmms-eval goes in without its requirements (setup_tests.sh says why); the lmms extra"
    echo "# brings those its import path needs, locked below."
    echo "lmms-eval==0.7.3"
    cat requirements/test-lock.txt.new
} > requirements/test-lock.txt
rm requirements/test-lock.txt.new
echo "requirements/test-lock.txt: $(grep -cE '^[A-Za-z0-9]' requirements/test-lock.txt) pins"
