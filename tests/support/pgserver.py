"""A real PostgreSQL for tests (Debian's ``postgresql`` package), on a unix socket only.

``PgServer()`` runs ``initdb`` into a fresh directory under the system temp dir (as the
``postgres`` user when the tests run as root: PostgreSQL refuses to run as root) and
``postgres`` with ``listen_addresses=''`` (no TCP at all) and its socket in that directory.
The data directory is thrown away after the tests, so fsync is off (nothing here needs to
survive a power cut; a stop and start keeps the data, which the outage tests use).

``start()`` waits (polling with a deadline) until a connection works; ``stop()`` sends
SIGINT (PostgreSQL's fast shutdown) to the postmaster by PID and SIGKILLs it after a
deadline; ``start()`` again reuses the same data directory and socket. ``new_database()``
creates an empty database and returns its libpq URI. Everything this module starts is
stopped again, also at interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg

SUPERUSER = "postgres"


def find_pg_bin() -> Path | None:
    """The directory of ``initdb`` and ``postgres``: $CKPTFS_PG_BIN, else the newest
    /usr/lib/postgresql/N/bin (Debian keeps them off PATH), else PATH."""
    env = os.environ.get("CKPTFS_PG_BIN")
    if env:
        return Path(env) if (Path(env) / "postgres").exists() else None
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"),
                   key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("postgres")
    return Path(on_path).parent if on_path else None


class PgServer:
    def __init__(self, bin_dir: Path | None = None) -> None:
        found = bin_dir or find_pg_bin()
        if found is None:
            raise FileNotFoundError("PostgreSQL server binaries not found (apt install postgresql)")
        self.bin_dir = found
        # The server must be able to enter its directory: pytest's tmp dirs are root's only.
        self.base = Path(tempfile.mkdtemp(prefix="ckptfs-pg-"))
        self.data = self.base / "data"
        self.socket_dir = self.base  # a short path: a unix socket path has ~100 bytes
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.base / "postgres.log"
        self._user = SUPERUSER if os.geteuid() == 0 else None
        if self._user is not None:
            pw = pwd.getpwnam(self._user)
            os.chown(self.base, pw.pw_uid, pw.pw_gid)
        self._run([str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", SUPERUSER,
                   "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"])
        _live.add(self)

    def _run(self, cmd: list[str]) -> None:
        subprocess.run(cmd, check=True, capture_output=True, user=self._user, env=_env())

    @property
    def url(self) -> str:
        return self.url_of("postgres")

    def url_of(self, database: str) -> str:
        """The libpq URI of ``database`` on this server (unix socket, no password)."""
        return f"postgresql://{SUPERUSER}@/{database}?host={self.socket_dir}"

    def start(self, timeout: float = 30.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                [str(self.bin_dir / "postgres"), "-D", str(self.data), "-k", str(self.socket_dir),
                 "-c", "listen_addresses=", "-c", "fsync=off", "-c", "max_connections=200",
                 "-c", "unix_socket_permissions=0777"],
                stdout=log, stderr=subprocess.STDOUT, user=self._user, env=_env(),
            )
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while True:  # polling with a deadline: the server says nothing when it is ready
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited ({self.proc.returncode}): {self.log_tail()}")
            if self.ready():
                return
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"postgres did not accept connections: {self.log_tail()}")
            time.sleep(0.05)

    def ready(self) -> bool:
        try:
            with psycopg.connect(self.url, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def stop(self, timeout: float = 20.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)  # fast shutdown: roll back sessions, checkpoint, exit
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def pause(self) -> None:
        """SIGSTOP the postmaster (a hung database: connections stall, nothing is refused)."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)

    def new_database(self) -> str:
        """A fresh empty database; its URI."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url_of(name)

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)
        _live.discard(self)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


_live: set[PgServer] = set()


@atexit.register
def _stop_all() -> None:
    for server in list(_live):
        server.destroy()


@contextlib.contextmanager
def running_postgres() -> Iterator[PgServer]:
    server = PgServer()
    try:
        server.start()
        yield server
    finally:
        server.destroy()
