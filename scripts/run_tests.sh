#!/usr/bin/env bash
# `make test`'s pytest runs, in two phases on this 2-core machine (CI too):
#   1. the unit and console tests on a pytest-xdist worker per core (`-n auto`), but
#   2. the `e2e` tests (real vLLM engines, which busy-poll a core each) and the `serial`
#      ones (they assert a latency or CPU bound) in one process, alone on the machine.
# Both leave out `soak` and `gpu_install` (make soak, make check-gpu-install).
#
# Usage: scripts/run_tests.sh PYTHON [pytest args...]  (extra args go to both phases, so
# `make test PYTEST_ARGS=tests/unit/test_cli.py` runs only what that selects). A phase
# that selects nothing (pytest exit 5) is skipped; both selecting nothing is an error.
set -uo pipefail
PY="$1"
shift
LEFT_OUT="not soak and not gpu_install"

phase() {
    local name="$1"
    shift
    printf '\n[test] %s\n' "$name" >&2
    "$PY" -m pytest --durations=30 "$@"
}

phase "unit and console tests, a worker per core" \
    -n auto -m "not e2e and not serial and $LEFT_OUT" "$@"
first=$?
phase "e2e and serial tests, one process" -m "(e2e or serial) and $LEFT_OUT" "$@"
second=$?

for rc in "$first" "$second"; do
    if [[ "$rc" -ne 0 && "$rc" -ne 5 ]]; then
        exit "$rc"
    fi
done
if [[ "$first" -eq 5 && "$second" -eq 5 ]]; then
    echo "[test] no test was selected" >&2
    exit 5
fi
