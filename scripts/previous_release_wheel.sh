#!/usr/bin/env bash
# The wheel the upgrade test (tests/integration/test_upgrade.py) starts a pipeline on: the package
# as built from git ref $1 (a release tag once there is one; until then the last main that passed
# CI), into tests/data/previous_release/ in place of the one there, with a README naming the ref.
#
#   bash scripts/previous_release_wheel.sh v0.2.0
set -euo pipefail
REF="${1:?usage: scripts/previous_release_wheel.sh <git ref of the previous release>}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$ROOT/tests/data/previous_release"
COMMIT="$(git -C "$ROOT" rev-parse --verify "$REF^{commit}")"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/kbp-previous.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
git -C "$ROOT" archive "$COMMIT" | tar -x -C "$WORK"
unset PYTHONPATH
"$ROOT/.venv/bin/python" -m build --wheel --outdir "$WORK/dist" "$WORK" > "$WORK/build.log" 2>&1 \
    || { tail -30 "$WORK/build.log" >&2; exit 1; }
rm -f "$OUT"/*.whl
mkdir -p "$OUT"
cp "$WORK"/dist/*.whl "$OUT/"
cat > "$OUT/README.md" <<TEXT
# The previous release, for the upgrade test

\`$(basename "$WORK"/dist/*.whl)\`: the package built from \`$REF\` (commit \`$COMMIT\`) by
\`bash scripts/previous_release_wheel.sh $REF\`. tests/integration/test_upgrade.py runs a pipeline
on it, then upgrades the deployment in place to the checkout's package. No release has been
published yet: until one is, this is the last main that passed CI; a release replaces it with its
own tag.
TEXT
echo "previous release: $OUT/$(basename "$WORK"/dist/*.whl) from $REF ($COMMIT)"
