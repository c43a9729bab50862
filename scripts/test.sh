#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite: ruff, mypy (ckptfs, tests and scripts),
# lint-imports, pytest.
#
#   scripts/test.sh [PYTEST ARGS...]      e.g. scripts/test.sh -k catalog -x
#
# Exit code: pytest's, or 1 when pytest collected no test (its exit 5) or a lint step failed.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

bash scripts/setup.sh

lint_failed=()
echo "== ruff check"
.venv/bin/ruff check . || lint_failed+=(ruff)
echo "== mypy ckptfs"
.venv/bin/mypy ckptfs || lint_failed+=(mypy)
echo "== mypy tests"
.venv/bin/mypy tests || lint_failed+=(mypy-tests)
echo "== mypy scripts"
.venv/bin/mypy scripts || lint_failed+=(mypy-scripts)
echo "== lint-imports"
# The import contracts in pyproject.toml; no cache: one that saw an edit in the same
# second as the last run would answer from before it.
.venv/bin/lint-imports --no-cache || lint_failed+=(lint-imports)

echo "== pytest"
rc=0
# Two test processes (pytest-xdist): most tests wait on mounts, servers and fsyncs, so two
# overlap well on 2 cores. CKPTFS_TEST_WORKERS=0 runs them in this process, one at a time.
.venv/bin/python -m pytest -q -n "${CKPTFS_TEST_WORKERS:-2}" --durations=30 tests "$@" || rc=$?

if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no tests: failing" >&2
    exit 1
fi
if [ "$rc" -ne 0 ]; then
    exit "$rc"
fi
if [ "${#lint_failed[@]}" -gt 0 ]; then
    echo "test.sh: tests passed but ${lint_failed[*]} failed" >&2
    exit 1
fi
