#!/usr/bin/env bash
# Drift, seen before it is suffered: installs the newest release of everything the test command
# installs (the project's own caps lifted too; torch stays at the pinned CPU 2.13.0 and
# lmms-eval at 0.7.3, which the project pins on purpose) into a scratch virtual environment,
# runs the CPU suite there, and names the packages whose newest release breaks it.
#
#   bash scripts/ci/check_drift.sh              # venv in ${TMPDIR:-/tmp}/videorouter-drift (made anew)
#   VR_DRIFT_VENV=/some/dir bash scripts/ci/check_drift.sh
#   bash scripts/ci/check_drift.sh -- tests/eval   # pytest arguments after --: a part of the suite
#
# How a package is named: every package whose newest version differs from
# requirements/test-lock.txt is a suspect. When the suite fails, each suspect in turn is put
# back to its locked version and the failed tests are run again; a suspect whose rollback
# makes them pass is named. The verdict is the last lines printed, and drift-report.txt in the
# venv. Not run by CI (it depends on what was released today); run it before moving the lock.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
ROOT="$PWD"
LOCK="$ROOT/requirements/test-lock.txt"
VENV="${VR_DRIFT_VENV:-${TMPDIR:-/tmp}/videorouter-drift}"
PYTEST_ARGS=(-m "not gpu")
if [ "${1:-}" = "--" ]; then shift; PYTEST_ARGS+=("$@"); fi

python3 -m venv --clear "$VENV"
PY="$VENV/bin/python"
LOG="$VENV/pip.log"
REPORT="$VENV/drift-report.txt"
: > "$REPORT"
say() { echo "$*" | tee -a "$REPORT"; }

TORCH_INDEX="${VR_TORCH_INDEX-https://download.pytorch.org/whl/cpu}"
echo "installing the newest releases into $VENV (pip's output: $LOG) ..."
"$PY" -m pip install torch==2.13.0 ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} >>"$LOG" 2>&1
"$PY" -m pip install --no-deps "lmms-eval==0.7.3" >>"$LOG" 2>&1
"$PY" -m pip install -e ".[dev,serve,ray,eval,lmms]" >>"$LOG" 2>&1
# The project's own caps (filelock<4, say) hold packages back: lift them, one package at a time,
# so that a cap which is no longer needed is seen too.
"$PY" -m pip list --outdated --format=json 2>>"$LOG" > "$VENV/outdated.json"
HELD="$("$PY" - "$VENV/outdated.json" <<'PY'
import json, sys
skip = {"torch", "pip", "lmms-eval", "lmms_eval"}
rows = json.load(open(sys.argv[1]))
print(" ".join(f"{r['name']}=={r['latest_version']}" for r in rows if r["name"].lower() not in skip))
PY
)"
if [ -n "$HELD" ]; then
    say "held back by a requirement, lifted to their newest: $HELD"
    # shellcheck disable=SC2086
    "$PY" -m pip install --no-deps $HELD >>"$LOG" 2>&1
fi

# Suspects: installed versions that differ from the lock.
"$PY" - "$LOCK" > "$VENV/suspects.txt" <<'PY'
import re, sys
from importlib.metadata import distributions
from packaging.markers import Marker
from packaging.utils import canonicalize_name
locked = {}
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line or line.startswith("-"):
        continue
    spec, _, marker = line.partition(";")
    if marker.strip() and not Marker(marker.strip()).evaluate():
        continue
    name, _, ver = spec.strip().partition("==")
    locked[canonicalize_name(name)] = ver.strip()
for d in distributions():
    name = canonicalize_name(d.metadata["Name"])
    if name in locked and locked[name] != d.version and name != "torch":
        print(name, locked[name], d.version)
PY
if [ -s "$VENV/suspects.txt" ]; then
    say "newer than the lock (package, locked, newest):"
    sed 's/^/    /' "$VENV/suspects.txt" | tee -a "$REPORT"
else
    say "every package is at its locked version: the lock is the newest of everything"
fi

cd "$ROOT"
run_pytest() {  # run_pytest JUNIT_XML ARGS...
    local xml="$1"; shift
    TRITON_INTERPRET=1 "$PY" -m pytest -q -p no:cacheprovider --junitxml="$xml" "$@"
}
failed_ids() {  # failed_ids JUNIT_XML: node ids of the tests that failed or errored in it
    "$PY" - "$1" <<'PY'
import os, sys, xml.etree.ElementTree as ET
for case in ET.parse(sys.argv[1]).iter("testcase"):
    if case.find("failure") is None and case.find("error") is None:
        continue
    parts = case.get("classname", "").split(".")
    # classname is the module's dotted path, then any test classes: the file is the longest
    # prefix that exists.
    for k in range(len(parts), 0, -1):
        if os.path.isfile(os.path.join(*parts[:k]) + ".py"):
            print("::".join(["/".join(parts[:k]) + ".py", *parts[k:], case.get("name")]))
            break
PY
}
set +e
run_pytest "$VENV/suite.xml" "${PYTEST_ARGS[@]}"
RC=$?
set -e
if [ "$RC" -eq 0 ]; then
    say "verdict: the suite passes on the newest releases; nothing breaks it"
    exit 0
fi
mapfile -t FAILED < <(failed_ids "$VENV/suite.xml")
say "the suite fails on the newest releases: ${#FAILED[@]} test(s)"
printf '    %s\n' "${FAILED[@]}" | tee -a "$REPORT"
if [ "${#FAILED[@]}" -eq 0 ] || [ ! -s "$VENV/suspects.txt" ]; then
    say "verdict: no package to blame (pytest exit $RC with nothing newer than the lock): a test or the machine"
    exit 1
fi
# Blame, test by test: a suspect is named for the failed tests that pass once it alone is back
# at its locked version; a test no rollback fixes fails on the lock's versions too (not drift).
BLAMED=()
declare -A FIXED=()
while read -r name locked newest; do
    "$PY" -m pip install --no-deps "$name==$locked" >>"$LOG" 2>&1
    run_pytest "$VENV/retry.xml" "${FAILED[@]}" >/dev/null 2>&1 || true
    mapfile -t STILL < <(failed_ids "$VENV/retry.xml")
    FIXES=()
    for t in "${FAILED[@]}"; do
        if ! printf '%s\n' "${STILL[@]}" | grep -qxF -- "$t"; then FIXES+=("$t"); FIXED["$t"]=1; fi
    done
    [ "${#FIXES[@]}" -gt 0 ] && BLAMED+=("$name $newest (locked $locked) breaks: ${FIXES[*]}")
    "$PY" -m pip install --no-deps "$name==$newest" >>"$LOG" 2>&1
done < "$VENV/suspects.txt"
if [ "${#BLAMED[@]}" -gt 0 ]; then
    say "verdict: the newest release of these breaks the suite (putting it back to the lock alone fixes the tests named):"
    printf '    %s\n' "${BLAMED[@]}" | tee -a "$REPORT"
fi
OTHER=()
for t in "${FAILED[@]}"; do [ -n "${FIXED[$t]:-}" ] || OTHER+=("$t"); done
if [ "${#OTHER[@]}" -gt 0 ]; then
    say "failing whatever single package is rolled back (a test, the machine, or several packages together):"
    printf '    %s\n' "${OTHER[@]}" | tee -a "$REPORT"
fi
exit 1
