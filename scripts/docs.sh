#!/usr/bin/env bash
# Check the generated configuration reference against the code, then build the docs with MkDocs in
# strict mode (any warning, broken link or missing nav file fails) into .tmp/site.
# Needs the dev extra in .venv (scripts/bootstrap.sh installs it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

.venv/bin/python -m airflow_kafka_backpressure.config.reference --check
.venv/bin/python -m mkdocs build --strict --site-dir .tmp/site
