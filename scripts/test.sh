#!/usr/bin/env bash
# Run the whole test suite on this machine: installs everything first (see bootstrap.sh).
# Real parts only: Apache Kafka (KRaft) with Spark's Kafka connector, Spark (local[2] and a standalone master+worker), Airflow
# (dag.test against SQLite) and PostgreSQL. Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/bootstrap.sh

# PostgreSQL for the ledger tests: as root, Debian's server is installed and started here; otherwise
# the test fixture starts a throw-away server from the PostgreSQL binaries on this machine.
if [[ -z "${KBP_TEST_POSTGRES_URL:-}" && $EUID -eq 0 ]]; then
    eval "$(bash .ci/postgres.sh)"
    trap 'bash .ci/postgres.sh stop >/dev/null 2>&1 || true' EXIT
fi

.venv/bin/python -m pytest -q --durations=30 "$@"
