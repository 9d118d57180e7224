"""Where the stack's secrets must be and must not be, from outside it (run by docker/test.sh).

    python docker/check_secrets.py connect-exposure --token-file FILE --container NAME --project NAME \
        --connect-ui URL [--files FILE ...]
    python docker/check_secrets.py broker-secret --project NAME --redis-port PORT --password-file FILE \
        [--dirs DIR ...] [--files FILE ...]

``connect-exposure``: the Spark Connect server's token (read from its volume) reached the server in
its environment and is nowhere else: on no command line in its container, not in the container's
configuration, on no page of the server's UI or REST API, in no log of the stack's containers, in
none of ``--files``. ``broker-secret``: Redis refuses a client without its password and answers one
with it, and the password (read from the airflow-secrets volume) is nowhere else: on no command
line and in no configuration of the stack's containers, in no container's log, in no file under
``--dirs`` (the task logs) and in none of ``--files``. Neither prints the secret. The containers
are read with the docker command (``docker exec``, ``logs``, ``inspect``); the check's helpers and
endpoints' options are check_stack.py's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import check_stack as cs
from check_stack import CheckFailed, log

#: every process's /proc/<pid>/<file> (cmdline, environ) in a container, one line each
PROC_SCRIPT = 'for p in /proc/[0-9]*; do tr "\\0" " " < "$p/{}" 2> /dev/null; echo; done'


def docker(*argv: str) -> bytes:
    """The docker command's output (a container's log: both streams)."""
    done = subprocess.run(["docker", *argv], capture_output=True, check=False)
    if done.returncode != 0 and argv[0] != "exec":
        raise CheckFailed(f"docker {argv[0]} failed: {done.stderr.decode(errors='replace')[-300:]}")
    return done.stdout + done.stderr if argv[0] == "logs" else done.stdout


def stack_containers(project: str, *, running: bool = False) -> list[str]:
    """The names of the compose project's containers: running or not, or ``running`` only."""
    names = docker(
        "ps",
        *(() if running else ("-a",)),
        "--filter",
        f"label=com.docker.compose.project={project}",
        "--format",
        "{{.Names}}",
    )
    return [n.decode() for n in names.split()]


def in_logs_and_files(secret: bytes, containers: list[str], files: list[str]) -> list[str]:
    """Where ``secret`` is among the containers' logs and the files."""
    found = [f"the log of {name}" for name in containers if secret in docker("logs", name)]
    for path in files:
        with open(path, "rb") as f:
            if secret in f.read():
                found.append(path)
    return found


def connect_exposure(args: argparse.Namespace) -> None:
    """The Connect server's token reached the server in its environment, and is nowhere else: not on
    a command line in its container, not in the container's configuration, not in the server's UI
    (pages and REST API), not in any log of the stack's containers, not in --files."""
    import requests

    with open(args.token_file) as f:
        token = f.read().strip()
    if len(token) < 20:
        raise CheckFailed(f"{args.token_file}: not a token ({len(token)} characters)")
    secret = token.encode()
    found: list[str] = []
    lines = docker("exec", args.container, "sh", "-c", PROC_SCRIPT.format("cmdline")).splitlines()
    if not any(b"SparkConnectServer" in line for line in lines):
        raise CheckFailed(f"no Spark Connect server among the processes of {args.container}")
    if any(secret in line for line in lines):
        found.append(f"a command line in {args.container}")
    if secret not in docker("exec", args.container, "sh", "-c", PROC_SCRIPT.format("environ")):
        raise CheckFailed(
            f"the token is in no process environment in {args.container}: how does the server get it?"
        )
    if secret in docker("inspect", args.container):
        found.append(f"docker inspect {args.container}")

    ui = args.connect_ui.rstrip("/")
    pages = [f"{ui}/environment/", f"{ui}/connect/", f"{ui}/jobs/", f"{ui}/api/v1/applications"]
    for app in requests.get(f"{ui}/api/v1/applications", timeout=30).json():
        pages += [f"{ui}/api/v1/applications/{app['id']}/{p}" for p in ("environment", "jobs", "executors")]
    for page in pages:
        r = requests.get(page, timeout=30)
        if r.status_code != 200:
            raise CheckFailed(f"GET {page}: HTTP {r.status_code}")
        if secret in r.content:
            found.append(page)

    containers = stack_containers(args.project)
    found += in_logs_and_files(secret, containers, args.files)
    if found:
        raise CheckFailed(f"the Connect server's token is in: {', '.join(found)}")
    log(
        f"the Connect server's token is in its process environment only: in none of {len(lines)} command "
        f"lines of {args.container}, its configuration, {len(pages)} pages of its UI and REST API, the logs "
        f"of {len(containers)} containers, {len(args.files)} files of this test's output"
    )


def broker_secret(args: argparse.Namespace) -> None:
    """Redis requires its password, which is in the secrets volume's files only."""
    with open(args.password_file) as f:
        password = f.read().strip()
    if len(password) < 20:
        raise CheckFailed(f"{args.password_file}: not a password ({len(password)} characters)")
    secret = password.encode()
    redis = f"{args.project}_redis_1"
    ping = f"redis-cli -h redis -p {args.redis_port} ping"
    without = docker("exec", redis, "sh", "-c", f"{ping} 2>&1").decode(errors="replace")
    if "NOAUTH" not in without:
        raise CheckFailed(f"Redis answered a client without its password: {without.strip()[:200]}")
    # the password from the file inside the container: on no command line, this one's included
    read = "REDISCLI_AUTH=\"$(sed -n 's/^requirepass //p' /opt/airflow/secrets/redis.conf)\""
    with_it = docker("exec", redis, "sh", "-c", f"{read} {ping} 2>&1").decode(errors="replace")
    if "PONG" not in with_it:
        raise CheckFailed(f"Redis did not answer a client with its password: {with_it.strip()[:200]}")
    log("Redis refuses a client without its password (NOAUTH) and answers one with it")

    found: list[str] = []
    containers = stack_containers(args.project)
    lines = 0
    for name in stack_containers(args.project, running=True):
        cmdlines = docker("exec", name, "sh", "-c", PROC_SCRIPT.format("cmdline")).splitlines()
        lines += len(cmdlines)
        if any(secret in line for line in cmdlines):
            found.append(f"a command line in {name}")
    found += [f"docker inspect {name}" for name in containers if secret in docker("inspect", name)]
    found += in_logs_and_files(secret, containers, args.files)
    files = [os.path.join(d, f) for top in args.dirs for d, _, names in os.walk(top) for f in names]
    found += in_logs_and_files(secret, [], files)
    if found:
        raise CheckFailed(f"Redis's password is in: {', '.join(found)}")
    log(
        f"Redis's password is in the secrets volume only: in none of {lines} command lines of the running "
        f"containers, the {len(containers)} containers' configuration and logs, {len(files)} task log "
        f"files, {len(args.files)} files of this test's output"
    )


def main(argv: list[str] | None = None) -> int:
    p, sub = cs.command_parser(__doc__)
    ce = sub.add_parser("connect-exposure")
    ce.add_argument("--token-file", required=True, help="the Connect server's token (never printed)")
    ce.add_argument("--container", required=True, help="the spark-connect container")
    ce.add_argument("--project", required=True, help="the compose project: every container's log is searched")
    ce.add_argument("--connect-ui", required=True, help="the Connect server's Spark UI")
    ce.add_argument("--files", nargs="*", default=[], help="more files to search (this test's output)")
    b = sub.add_parser("broker-secret")
    b.add_argument("--project", required=True, help="the compose project")
    b.add_argument("--redis-port", type=int, required=True)
    b.add_argument("--password-file", required=True, help="Redis's password (never printed)")
    b.add_argument("--dirs", nargs="*", default=[], help="folders whose files are searched (the task logs)")
    b.add_argument("--files", nargs="*", default=[], help="more files to search (this test's output)")
    commands = {"connect-exposure": connect_exposure, "broker-secret": broker_secret}
    return cs.dispatch(commands, p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
