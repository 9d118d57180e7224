#!/usr/bin/env bash
# The artifact (issue 24, item 4): build the sdist and the wheel of the checkout as a user gets
# them, install the wheel into a clean virtual environment and check that Airflow finds the provider.
#
#   1. copy the checkout's files (git-tracked and untracked-not-ignored, as a fresh clone would hold
#      them) into a temp dir and build the sdist and the wheel there (python -m build, isolated:
#      setuptools comes from PyPI); twine check --strict on both;
#   2. the sdist holds pyproject.toml, README.md and every file of the package; a wheel rebuilt from
#      the unpacked sdist holds the same files as the first wheel; the wheel holds every file of
#      the package, package data included (each non-.py file is named in the output);
#   3. a clean venv (python3 -m venv, no system site packages, not the repo's .venv) gets the wheel,
#      pinned by constraints.txt, from pip's cache where it can (timed; --no-compile: byte-compiling
#      Airflow and pyspark costs CPU minutes on 2 cores, and only what the checks import is compiled);
#      then, for each other Spark minor's constraints file (constraints/spark-<minor>.txt), a venv of
#      its own (the first venv's packages less the provider, pyspark and pyspark-client) gets the
#      wheel with it (pyspark and pyspark-client of that release), pip check passes and the package
#      imports there;
#   4. with AIRFLOW_HOME in the temp dir, cwd outside the checkout and PYTHONPATH unset: the
#      provider, its connection types and its plugin as Airflow's CLI lists them (no metadata
#      database needed), and the modules, templates, YAML and migrations loaded from the venv.
#
# Writes nothing into the checkout; the temp dir is removed on exit (KBP_KEEP_WHEEL_CHECK=1 keeps it).
# One line per check; exits non-zero with a line naming what is missing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"            # the clean venv's interpreter
BUILD_PYTHON="${BUILD_PYTHON:-$ROOT/.venv/bin/python}"  # has build and twine (the dev extra)
PKG=airflow_kafka_backpressure
DIST=airflow-provider-kafka-backpressure
unset PYTHONPATH # neither the builds nor the venv may see the checkout (or anything else) through it

WORK="$(mktemp -d "${TMPDIR:-/tmp}/kbp-wheel-check.XXXXXX")"
cleanup() { if [[ -n "${KBP_KEEP_WHEEL_CHECK:-}" ]]; then echo "wheel_check: kept $WORK"; else rm -rf "$WORK"; fi; }
trap cleanup EXIT

T0=$(date +%s)
ok() { echo "wheel_check: ok   $*"; }
fail() {
    echo "wheel_check: FAIL $*" >&2
    exit 1
}
step() { echo "wheel_check: --   $* ($(($(date +%s) - T0)) s)"; }
# a command's output to a log; on failure its tail and a line naming the step
run() {
    local what="$1" log="$WORK/logs/$2"
    shift 2
    if ! "$@" >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        fail "$what (log above)"
    fi
}
mkdir -p "$WORK/logs"

# --- 1. the checkout's files, then the sdist and the wheel --------------------------------------
step "copying the checkout's files"
mkdir -p "$WORK/src"
(
    cd "$ROOT"
    git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do
            # deleted but still tracked files are not there; .venv is a symlink .gitignore's '.venv/' misses
            if [[ -e "$f" && "$f" != .venv ]]; then printf '%s\0' "$f"; fi
        done |
        tar --null -T - -cf - | tar -C "$WORK/src" -xf -
)
# the package's files as the checkout holds them: what the sdist and the wheel must ship
mapfile -t PKG_FILES < <(cd "$WORK/src" && find "$PKG" -type f ! -name '*.pyc' | LC_ALL=C sort)
mapfile -t DATA_FILES < <(printf '%s\n' "${PKG_FILES[@]}" | grep -v '\.py$')
[[ ${#PKG_FILES[@]} -gt 0 ]] || fail "no files under $PKG in the checkout"

step "building the sdist and the wheel (python -m build --sdist --wheel)"
run "python -m build --sdist --wheel" build.log \
    "$BUILD_PYTHON" -m build --sdist --wheel --outdir "$WORK/dist" "$WORK/src"
SDIST=("$WORK"/dist/*.tar.gz)
WHEEL=("$WORK"/dist/*.whl)
[[ ${#SDIST[@]} -eq 1 && -f "${SDIST[0]}" ]] || fail "python -m build made no single sdist: $(ls "$WORK/dist")"
[[ ${#WHEEL[@]} -eq 1 && -f "${WHEEL[0]}" ]] || fail "python -m build made no single wheel: $(ls "$WORK/dist")"
SDIST="${SDIST[0]}"
WHEEL="${WHEEL[0]}"
ok "built $(basename "$SDIST") ($(du -k "$SDIST" | cut -f1) KB) and $(basename "$WHEEL") ($(du -k "$WHEEL" | cut -f1) KB)"

run "twine check --strict" twine.log "$BUILD_PYTHON" -m twine check --strict "$SDIST" "$WHEEL"
ok "twine check --strict: $(grep -c PASSED "$WORK/logs/twine.log") of 2 passed"

# --- 2. what the archives hold -------------------------------------------------------------------
# member lists: the sdist's without its top directory, the wheel's as they are
"$BUILD_PYTHON" - "$SDIST" >"$WORK/sdist.txt" <<'EOF'
import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    for m in t.getmembers():
        if m.isfile():
            print(m.name.split("/", 1)[1])
EOF
list_wheel() {
    "$BUILD_PYTHON" -c 'import sys, zipfile; print("\n".join(zipfile.ZipFile(sys.argv[1]).namelist()))' "$1"
}
list_wheel "$WHEEL" >"$WORK/wheel.txt"

missing=()
for f in pyproject.toml README.md PKG-INFO "${PKG_FILES[@]}"; do
    grep -qxF "$f" "$WORK/sdist.txt" || missing+=("$f")
done
[[ ${#missing[@]} -eq 0 ]] || fail "the sdist lacks ${missing[*]} (MANIFEST.in / package-data)"
ok "sdist holds pyproject.toml, README.md and all ${#PKG_FILES[@]} files of $PKG"

missing=()
for f in "${PKG_FILES[@]}"; do
    grep -qxF "$f" "$WORK/wheel.txt" || missing+=("$f")
done
[[ ${#missing[@]} -eq 0 ]] || fail "the wheel lacks ${missing[*]} (pyproject.toml [tool.setuptools.package-data])"
ok "wheel holds all ${#PKG_FILES[@]} files of $PKG"
for f in "${DATA_FILES[@]}"; do ok "wheel holds package data $f"; done
extra=$(grep -v -e "^$PKG/" -e '\.dist-info/' "$WORK/wheel.txt" || true)
[[ -z "$extra" ]] || fail "the wheel holds files outside $PKG: $extra"
ok "wheel holds nothing outside $PKG and its .dist-info"
EP=$("$BUILD_PYTHON" -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
print("".join(z.read(n).decode() for n in z.namelist() if n.endswith(".dist-info/entry_points.txt")))' "$WHEEL")
grep -q "^\[apache_airflow_provider\]" <<<"$EP" && grep -q "^provider_info = $PKG.get_provider_info:get_provider_info" <<<"$EP" ||
    fail "the wheel's entry_points.txt lacks apache_airflow_provider provider_info"
grep -q "^\[airflow.plugins\]" <<<"$EP" && grep -q "= $PKG.plugins.monitor:KafkaBackpressurePlugin" <<<"$EP" ||
    fail "the wheel's entry_points.txt lacks the airflow.plugins entry KafkaBackpressurePlugin"
ok "wheel's entry points: apache_airflow_provider and airflow.plugins"

step "rebuilding the wheel from the unpacked sdist"
mkdir -p "$WORK/unpacked"
tar -C "$WORK/unpacked" -xzf "$SDIST"
run "python -m build --wheel from the sdist" rebuild.log \
    "$BUILD_PYTHON" -m build --wheel --outdir "$WORK/rebuilt" "$WORK"/unpacked/*/
list_wheel "$WORK"/rebuilt/*.whl >"$WORK/rewheel.txt"
if ! diff <(LC_ALL=C sort "$WORK/wheel.txt") <(LC_ALL=C sort "$WORK/rewheel.txt") >"$WORK/logs/rebuild.diff"; then
    cat "$WORK/logs/rebuild.diff" >&2
    fail "a wheel rebuilt from the sdist differs from the checkout's wheel ('<' only in the checkout's; MANIFEST.in)"
fi
ok "wheel rebuilt from the sdist holds the same $(wc -l <"$WORK/wheel.txt") files"

# --- 3. a clean venv with the wheel ---------------------------------------------------------------
step "creating a clean venv with $("$PYTHON" --version 2>&1)"
"$PYTHON" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
[[ "$("$VPY" -c 'import sys; print(sys.prefix != sys.base_prefix)')" == True ]] || fail "$WORK/venv is not a venv"
grep -qx 'include-system-site-packages = false' "$WORK/venv/pyvenv.cfg" || fail "the venv sees the system site packages"
step "installing the wheel with -c constraints.txt"
t=$(date +%s)
run "pip install of the wheel with -c constraints.txt" pip.log \
    env PIP_DISABLE_PIP_VERSION_CHECK=1 "$VPY" -m pip install --no-compile -c "$ROOT/constraints.txt" "$WHEEL"
# (pip 23 prints "Downloading" for files its HTTP cache serves too; "Using cached" is its wheel cache)
ok "pip install of the wheel and its $(grep -c '^Collecting' "$WORK/logs/pip.log" || true) requirements in $(($(date +%s) - t)) s"
installed=$("$VPY" -m pip show "$DIST" 2>/dev/null | sed -n 's/^Version: //p')
[[ -n "$installed" ]] || fail "pip show $DIST: not installed in the venv"
ok "$DIST $installed installed; apache-airflow $("$VPY" -m pip show apache-airflow | sed -n 's/^Version: //p')"

# every other Spark minor: a venv of its own gets the wheel with its constraints file (pyspark and
# pyspark-client of that release, everything else as constraints.txt pins), and pip check passes there;
# the provider imports with that pyspark (the Airflow checks below run in the first venv)
for file in "$ROOT"/constraints/spark-*.txt; do
    minor="$(basename "$file" .txt)"
    want="$(sed -n 's/^pyspark==//p' "$file")"
    [[ "$want" != "$(sed -n 's/^pyspark==//p' "$ROOT/constraints.txt")" ]] || continue
    step "a venv of its own for $minor: installing the wheel with -c constraints/$minor.txt"
    "$PYTHON" -m venv "$WORK/venv-$minor"
    MPY="$WORK/venv-$minor/bin/python"
    t=$(date +%s)
    # it starts from the first venv's packages less the provider, pyspark and pyspark-client (the
    # constraints files differ only in those two), so pip resolves the whole set against this
    # minor's constraints but unpacks only what differs: a fresh install of all 144 took about a
    # minute on the idle machine and 6 to 10 minutes beside the suite (2026-12-01)
    cp -a "$WORK/venv/lib/." "$WORK/venv-$minor/lib/"
    run "pip uninstall of the provider, pyspark and pyspark-client in the $minor venv" "pip-uninstall-$minor.log" \
        env PIP_DISABLE_PIP_VERSION_CHECK=1 "$MPY" -m pip uninstall -y "$DIST" pyspark pyspark-client
    run "pip install of the wheel with -c constraints/$minor.txt" "pip-$minor.log" \
        env PIP_DISABLE_PIP_VERSION_CHECK=1 "$MPY" -m pip install --no-compile -c "$file" "$WHEEL"
    run "pip check in the $minor venv" "pip-check-$minor.log" env PIP_DISABLE_PIP_VERSION_CHECK=1 "$MPY" -m pip check
    got="$(cd "$WORK/logs" && "$MPY" -c 'from importlib.metadata import version
import airflow_kafka_backpressure.spark.job, pyspark
print(pyspark.__version__, version("pyspark"), version("pyspark-client"))')"
    [[ "$got" == "$want $want $want" ]] || fail "with constraints/$minor.txt the venv holds pyspark, pyspark-client $got, not $want"
    ok "constraints/$minor.txt: the wheel installs with pyspark and pyspark-client $want in $(($(date +%s) - t)) s; pip check passes; the job module imports"
    rm -rf "$WORK/venv-$minor"  # a few hundred MB: gone before the next one
done

# --- 4. Airflow and the installed package -------------------------------------------------------
export AIRFLOW_HOME="$WORK/airflow_home"
mkdir -p "$AIRFLOW_HOME" "$WORK/cwd"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
cd "$WORK/cwd" # the checkout is not on sys.path from here
AIRFLOW="$WORK/venv/bin/airflow"

step "airflow providers get $DIST"
run "airflow providers get $DIST" provider.json "$AIRFLOW" providers get "$DIST" --full -o json
run "airflow providers hooks" hooks.json "$AIRFLOW" providers hooks -o json
run "airflow plugins" plugins.json "$AIRFLOW" plugins -o json
# read by wheel_check_installed.py
export KBP_WC_LOGS="$WORK/logs" KBP_WC_VENV="$WORK/venv" KBP_WC_CHECKOUT="$ROOT"

step "checking Airflow's view and the installed package"
cp "$ROOT/scripts/wheel_check_installed.py" "$WORK/"  # run from the temp dir: the checkout stays off sys.path
"$VPY" "$WORK/wheel_check_installed.py"

echo "wheel_check: all checks passed in $(($(date +%s) - T0)) s"
