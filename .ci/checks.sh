#!/usr/bin/env bash
# The static checks beside the tests (issue 24), in order, stopping at the first that fails:
# lint, format, types, the tests' fixtures, the docs build. Prints each step's seconds. Needs .venv with the dev extra
# (scripts/bootstrap.sh installs it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

total_start=$(date +%s)
step() {
    local name="$1" start rc=0
    shift
    echo "checks: $name: $*"
    start=$(date +%s)
    "$@" || rc=$?
    echo "checks: $name: exit $rc after $(($(date +%s) - start)) s"
    if [[ $rc -ne 0 ]]; then
        echo "checks: FAILED at $name ($(($(date +%s) - total_start)) s in all)" >&2
        exit "$rc"
    fi
}

step "ruff check" .venv/bin/ruff check .
step "ruff format" .venv/bin/ruff format --check .
# mypy reads its settings (files, strictness) from [tool.mypy] in pyproject.toml once that section
# exists; until then, the package with missing stubs ignored.
if grep -q '^\[tool\.mypy\]' pyproject.toml; then
    step "mypy" .venv/bin/mypy
else
    step "mypy" .venv/bin/mypy airflow_kafka_backpressure --ignore-missing-imports
fi
# every test's fixtures resolve, without running anything (pytest --setup-plan): a fixture imported
# from another module and dropped by a lint fix fails here, not as a setup error deep in the suite
fixtures() {
    # its plan lists every fixture of every test: printed only when it fails
    local out rc=0
    out="$(.venv/bin/python -m pytest --setup-plan -q -p no:cacheprovider 2>&1)" || rc=$?
    if [[ $rc -ne 0 ]]; then
        grep -vE '^ *(SETUP|TEARDOWN) ' <<<"$out" | tail -80
    else
        tail -1 <<<"$out"
    fi
    return "$rc"
}
step "fixtures" fixtures
# each Spark minor's constraints file is constraints.txt with that minor's pyspark (scripts/spark_constraints.py)
step "spark constraints" .venv/bin/python scripts/spark_constraints.py --check
# the docs build, once scripts/docs.sh exists
if [[ -f scripts/docs.sh ]]; then
    step "docs" bash scripts/docs.sh
else
    echo "checks: docs: skipped (no scripts/docs.sh yet)"
fi
echo "checks: all passed in $(($(date +%s) - total_start)) s"
