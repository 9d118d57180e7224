"""PostgreSQL fixtures: a real server for ledger tests.

``postgres_url`` (session): a SQLAlchemy URL of a real PostgreSQL database.

* ``KBP_TEST_POSTGRES_URL`` set: that server is used (CI: ``eval "$(.ci/postgres.sh)"``).
* otherwise a throw-away server is started from the local binaries (``initdb``/``postgres`` on PATH or
  under ``/usr/lib/postgresql/*/bin``): a data directory under ``.tmp/``, listening on 127.0.0.1 and a
  free port (its unix socket in the same directory), fsync off. As root it runs as the ``postgres``
  user (initdb refuses root). It is stopped by PID at the end of the session and its directory removed.
* no server can be started: the tests FAIL with the reason, unless ``KBP_SKIP_POSTGRES=1`` (skip).

``postgres_schema_url`` (function): the same server with a fresh schema (``search_path``) per test,
dropped afterwards, so tests never see each other's tables and never touch other schemas of an
external database.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from kbp_local.process import free_port

REPO = Path(__file__).resolve().parents[1]
TMP_ROOT = REPO / ".tmp"

ENV_URL = "KBP_TEST_POSTGRES_URL"
ENV_SKIP = "KBP_SKIP_POSTGRES"
DATABASE = "kbp_test"


class PostgresUnavailable(RuntimeError):
    pass


def find_postgres_bin() -> Path:
    """The directory holding initdb, pg_ctl and postgres of one PostgreSQL version."""
    candidates: list[Path] = []
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(os.path.realpath(on_path)).parent)

    def version(p: Path) -> tuple[int, ...]:
        try:
            return tuple(int(x) for x in p.parent.name.split("."))
        except ValueError:
            return (0,)

    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version, reverse=True)
    for d in candidates:
        if all((d / exe).is_file() and os.access(d / exe, os.X_OK) for exe in ("initdb", "postgres")):
            return d
    raise PostgresUnavailable(
        "No PostgreSQL server binaries (initdb, postgres) on PATH or under /usr/lib/postgresql/*/bin. "
        "Install them (Debian: apt-get install postgresql), or point the tests at a server with "
        f'{ENV_URL}=postgresql+psycopg2://user:password@host:port/db (e.g. eval "$(.ci/postgres.sh)"), '
        f"or set {ENV_SKIP}=1 to skip the PostgreSQL tests."
    )


class LocalPostgres:
    """A throw-away PostgreSQL server in ``base_dir``; ``start()`` / ``stop()``."""

    def __init__(self, base_dir: Path, *, database: str = DATABASE, start_timeout_s: float = 60.0):
        self.database = database
        self.start_timeout_s = start_timeout_s
        # TCP connections authenticate with a password (scram-sha-256), as a production server's do:
        # a test of a wrong password must meet a server that checks it
        self.password = secrets.token_urlsafe(16)
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.bin_dir = find_postgres_bin()
        self.run_as: str | None = None
        if os.geteuid() == 0:
            import pwd

            for name in ("postgres", "nobody"):
                try:
                    pwd.getpwnam(name)
                except KeyError:
                    continue
                self.run_as = name
                break
            if self.run_as is None:
                raise PostgresUnavailable(
                    "Running as root and there is neither a 'postgres' nor a 'nobody' user to run "
                    "initdb as (it refuses root). Create one (useradd -r postgres) or set "
                    f"{ENV_URL}."
                )
        # A checkout in a private directory (e.g. a clone in a 0700 temporary folder, run as root):
        # the server's user could not reach base_dir, so the server lives in a folder of its own
        # under the system's temporary directory instead, removed with it.
        self._own_root: Path | None = None
        if self.run_as is not None and not _searchable_by(base_dir.parent, self.run_as):
            user = self.run_as
            # TMPDIR may point into the checkout itself (the Spark environment sets it there)
            tmp = next(
                (d for d in (tempfile.gettempdir(), "/tmp", "/var/tmp") if _searchable_by(Path(d), user)),
                None,
            )
            if tmp is None:
                raise PostgresUnavailable(
                    f"Running as root, the server runs as {user!r}, which can reach neither {base_dir.parent} "
                    f"nor a temporary directory. Make {base_dir.parent} searchable (chmod o+x on each parent) "
                    f"or set {ENV_URL}."
                )
            self._own_root = Path(tempfile.mkdtemp(prefix="kbp-postgres-", dir=tmp))
            os.chmod(self._own_root, 0o711)  # searchable by the server's user, not listable
            base_dir = self._own_root / base_dir.name
        self.base_dir = base_dir
        self.data_dir = base_dir / "data"
        self.socket_dir = base_dir / "sock"
        self.log_path = base_dir / "postgres.log"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://postgres:{self.password}@127.0.0.1:{self.port}/{self.database}"

    def _popen_kwargs(self) -> dict:
        kw: dict = {"start_new_session": True, "env": self._env()}
        if self.run_as is not None:
            import pwd

            pw = pwd.getpwnam(self.run_as)
            kw.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
        return kw

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(LC_ALL="C", LANG="C", TZ="UTC")
        if self.run_as is not None:
            env["HOME"] = str(self.base_dir)
        return env

    def _run(self, args: list[str], what: str) -> None:
        res = subprocess.run(
            args, capture_output=True, text=True, timeout=120, cwd=self.base_dir, **self._popen_kwargs()
        )
        if res.returncode != 0:
            raise PostgresUnavailable(
                f"{what} failed (exit {res.returncode}): {' '.join(args)}\n{res.stdout}\n{res.stderr}"
                + self._permission_hint()
            )

    def _permission_hint(self) -> str:
        if self.run_as is None:
            return ""
        return (
            f"\nThe server runs as user {self.run_as!r}: every parent directory of {self.base_dir} must "
            f"be searchable (o+x) by that user, or set {ENV_URL}."
        )

    def start(self) -> str:
        self.base_dir.mkdir(parents=True, exist_ok=False)
        self.socket_dir.mkdir()
        if self.run_as is not None:
            import pwd

            pw = pwd.getpwnam(self.run_as)
            for p in (self.base_dir, self.socket_dir):
                os.chown(p, pw.pw_uid, pw.pw_gid)
        pwfile = self.base_dir / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self.run_as is not None:
            os.chown(pwfile, pwd.getpwnam(self.run_as).pw_uid, -1)
        pwfile.chmod(0o600)
        self._run(
            [
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                "postgres",
                f"--pwfile={pwfile}",
                "--auth-local=trust",  # the unix socket in base_dir (only the test's own user reaches it)
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
            "initdb",
        )
        last_error = ""
        for _ in range(5):  # a free port can be taken between probing and binding: retry
            self.port = free_port()
            self._spawn()
            try:
                self._wait_ready()
                self._create_database()
                return self.url
            except PostgresUnavailable as e:
                last_error = str(e)
                self._kill()
                if "could not bind" not in self._log_tail() and "in use" not in self._log_tail():
                    break
        raise PostgresUnavailable(last_error + self._permission_hint())

    def _spawn(self) -> None:
        """Start the postmaster on ``self.port`` (the data directory exists)."""
        log = open(self.log_path, "ab")
        if self.run_as is not None:
            import pwd

            pw = pwd.getpwnam(self.run_as)
            os.chown(self.log_path, pw.pw_uid, pw.pw_gid)
        try:
            self.proc = subprocess.Popen(
                [
                    str(self.bin_dir / "postgres"),
                    "-D",
                    str(self.data_dir),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    "-k",
                    str(self.socket_dir),
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "max_connections=100",
                    "-c",
                    "logging_collector=off",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.base_dir,
                **self._popen_kwargs(),
            )
        finally:
            log.close()

    def shutdown(self) -> None:
        """Stop the server (fast shutdown), keeping its data: :meth:`restart` brings it back."""
        self._kill()

    def restart(self) -> None:
        """Start the server again on the same port and data directory."""
        self._spawn()
        self._wait_ready()

    def _log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def _connect(self, dbname: str):
        import psycopg2

        return psycopg2.connect(
            host="127.0.0.1",
            port=self.port,
            user="postgres",
            password=self.password,
            dbname=dbname,
            connect_timeout=2,
        )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise PostgresUnavailable(
                    f"postgres exited with {self.proc.returncode} on port {self.port}. Log "
                    f"{self.log_path}:\n{self._log_tail()}"
                )
            try:
                self._connect("postgres").close()
                return
            except Exception as e:  # not accepting connections yet
                last = e
                time.sleep(0.1)
        raise PostgresUnavailable(
            f"postgres did not accept connections on 127.0.0.1:{self.port} within "
            f"{self.start_timeout_s:.0f}s ({last}). Log {self.log_path}:\n{self._log_tail()}"
        )

    def _create_database(self) -> None:
        conn = self._connect("postgres")
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{self.database}"')
        finally:
            conn.close()

    def _kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        # SIGINT = "fast shutdown": the postmaster ends its backends and exits.
        os.kill(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGQUIT)  # immediate shutdown
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def stop(self) -> None:
        try:
            self._kill()
        finally:
            shutil.rmtree(self._own_root or self.base_dir, ignore_errors=True)


def _searchable_by(path: Path, user: str) -> bool:
    """Whether ``user`` may search (x) ``path`` and every directory above it (by their modes)."""
    import grp
    import pwd

    pw = pwd.getpwnam(user)
    gids = {pw.pw_gid} | {g.gr_gid for g in grp.getgrall() if user in g.gr_mem}
    for p in (path, *path.parents):
        try:
            st = p.stat()
        except OSError:
            continue  # not created yet: mkdir makes it with the default mode
        if st.st_uid == pw.pw_uid:
            bit = stat.S_IXUSR
        elif st.st_gid in gids:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return False
    return True


def _check_url(url: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as e:
        raise PostgresUnavailable(
            f"{ENV_URL} is set but the server cannot be reached: {e}. Fix the URL, start the server "
            f"(.ci/postgres.sh), or unset {ENV_URL} to start a throw-away server."
        ) from e
    finally:
        engine.dispose()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """SQLAlchemy URL of a real PostgreSQL database for the whole session."""
    if os.environ.get(ENV_SKIP) == "1":
        pytest.skip(f"{ENV_SKIP}=1: PostgreSQL tests skipped")
    external = os.environ.get(ENV_URL)
    if external:
        try:
            _check_url(external)
        except PostgresUnavailable as e:
            pytest.fail(str(e), pytrace=False)
        yield external
        return
    server: LocalPostgres | None = None
    try:
        server = LocalPostgres(TMP_ROOT / f"postgres-{os.getpid()}-{secrets.token_hex(3)}")
        server.start()
    except PostgresUnavailable as e:
        if server is not None:
            server.stop()
        pytest.fail(
            f"Could not start a PostgreSQL server for the ledger tests: {e}\n"
            f"Set {ENV_URL} to use an existing server, or {ENV_SKIP}=1 to skip these tests.",
            pytrace=False,
        )
    try:
        yield server.url
    finally:
        server.stop()


def url_with_search_path(url: str, schema: str) -> str:
    """``url`` whose connections use ``schema`` (psycopg2 ``options=-c search_path=...``)."""
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote(f'-csearch_path={schema}')}"


@pytest.fixture
def postgres_schema_url(postgres_url: str) -> Iterator[str]:
    """The session's PostgreSQL with a fresh, empty schema for this test (dropped afterwards)."""
    from sqlalchemy import create_engine, text

    schema = f"kbp_t_{secrets.token_hex(6)}"
    engine = create_engine(postgres_url)
    try:
        with engine.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        yield url_with_search_path(postgres_url, schema)
        with engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    finally:
        engine.dispose()
