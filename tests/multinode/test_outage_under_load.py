"""PostgreSQL stopped and started under load on two nodes (docs/multinode.md "Losing
PostgreSQL"): real mounts a and b on one real PostgreSQL catalog and one SeaweedFS bucket.
Writer threads on both nodes keep creating, rewriting, closing and re-reading files, and a
reader on each node keeps reading a file it opened before the outage, while the database is
down for longer than the nodes' session timeout.

Every system call either succeeds or fails with EIO within a bound (a catalog call fails
after at most CONNECT_TIMEOUT / POOL_WAIT; a system call makes a few of them); the open
files read on, bit-identical; a file whose close succeeded reads back bit-identical on both
nodes afterwards; a file whose write or close failed holds its last good version (or the
failed one whole, if its commit reached the database before the connection died), never
other bytes; both daemons live on, registered again, and new files work on both nodes."""

from __future__ import annotations

import errno
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest

from tests.conftest import CkptFactory
from tests.multinode.conftest import Cluster, sync
from tests.support.mountutil import Mount, pid_alive, wait_until
from tests.support.pgserver import PgServer

from ckptfs.catalog import PostgresCatalog
from ckptfs.catalog.postgres import CONNECT_TIMEOUT, DOWN_WAIT, POOL_WAIT
from ckptfs.errors import CatalogUnavailable

T = TypeVar("T")

CS = 256 * 1024
SESSION_TIMEOUT = 3.0  # s: shorter than the outage, so that both sessions expire meanwhile
# A system call on the mount is a few catalog calls (a lookup and a create, a commit and
# the collection of what it replaced), queued behind the daemon's background services for
# a catalog slot: the first call to meet the outage fails within POOL_WAIT (a connection
# attempt within CONNECT_TIMEOUT), every later one within DOWN_WAIT.
BOUND_S = POOL_WAIT + CONNECT_TIMEOUT + 4 * DOWN_WAIT
NAMES_PER_WRITER = 6  # names each writer rewrites in turn: new files first, then versions
WRITERS_PER_NODE = 2


@dataclass
class History:
    """What one writer did to each of its names: (data, close succeeded), in order."""

    versions: dict[str, list[tuple[bytes, bool]]] = field(default_factory=dict)

    def allowed(self, name: str) -> tuple[bytes | None, list[bytes]]:
        """(the last version whose close succeeded or None, the versions a read may show)."""
        hist = self.versions.get(name, [])
        last_ok = max((i for i, (_, ok) in enumerate(hist) if ok), default=-1)
        later_failed = [d for d, ok in hist[last_ok + 1:] if not ok]
        if last_ok < 0:
            return None, [b"", *later_failed]  # created (empty) or a failed commit that landed
        return hist[last_ok][0], [hist[last_ok][0], *later_failed]


@dataclass
class Load:
    """The threads of the load and what they saw."""

    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    ok: dict[str, int] = field(default_factory=dict)  # successful cycles per worker
    eio: dict[str, int] = field(default_factory=dict)  # EIO failures per worker
    problems: list[str] = field(default_factory=list)  # anything the test must fail on
    slowest: dict[str, float] = field(default_factory=dict)  # s, per system call kind
    histories: dict[str, History] = field(default_factory=dict)

    def timed(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        t0 = time.monotonic()
        try:
            return fn(*args)
        finally:
            took = time.monotonic() - t0
            with self.lock:
                self.slowest[what] = max(self.slowest.get(what, 0.0), took)

    def failed(self, who: str, what: str, exc: OSError) -> None:
        with self.lock:
            if exc.errno == errno.EIO:
                self.eio[who] = self.eio.get(who, 0) + 1
            else:
                self.problems.append(f"{who}: {what} failed with {errno.errorcode.get(exc.errno or 0)}"
                                     f" ({exc}), not EIO")

    def count(self, who: str) -> None:
        with self.lock:
            self.ok[who] = self.ok.get(who, 0) + 1

    def wrong(self, text: str) -> None:
        with self.lock:
            self.problems.append(text)


def read_all(load: Load, path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        out = bytearray()
        while True:
            piece = load.timed("read", os.read, fd, 1 << 20)
            if not piece:
                return bytes(out)
            out += piece
    finally:
        load.timed("close", os.close, fd)


def writer(load: Load, m: Mount, who: str, bufs: list[bytes], rng: random.Random) -> None:
    """Create, write, close and re-read files; rewrite them with new versions in turn."""
    hist = load.histories[who]
    i = 0
    while not load.stop.is_set():
        name = f"{who}-{i % NAMES_PER_WRITER}.bin"
        data = bufs[rng.randrange(len(bufs))]
        path = m.mountpoint / "load" / name
        i += 1
        closed = False
        try:
            fd = load.timed("open", os.open, path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            try:
                view = memoryview(data)
                while view:
                    n = load.timed("write", os.write, fd, view[: 1 << 20])
                    view = view[n:]
            finally:
                load.timed("close", os.close, fd)
            closed = True
        except OSError as exc:
            load.failed(who, f"writing {name}", exc)
        hist.versions.setdefault(name, []).append((data, closed))
        # Read back on the same node: the new version after a good close; after a failed
        # one, the last good version (or the failed one whole), never other bytes.
        good, allowed = hist.allowed(name)
        try:
            got = read_all(load, path)
        except OSError as exc:
            if not (exc.errno == errno.ENOENT and good is None):  # never created: absent
                load.failed(who, f"re-reading {name}", exc)
            continue
        if closed and got != data:
            load.wrong(f"{who}: {name} read back {len(got)} bytes, not the {len(data)} it closed")
        elif got not in allowed:
            load.wrong(f"{who}: {name} after a failed close reads {len(got)} bytes that are no "
                       f"version of it (last good: {None if good is None else len(good)})")
        elif closed:
            load.count(who)


def reader(load: Load, m: Mount, who: str, path: Path, want: bytes) -> None:
    """Keep reading a file opened before the outage: it needs no catalog."""
    with open(path, "rb", buffering=0) as f:
        load.count(who)  # opened
        while not load.stop.is_set():
            try:
                load.timed("read (open before)", f.seek, 0)
                got = load.timed("read (open before)", f.read)
            except OSError as exc:
                load.wrong(f"{who}: a read of a file open before the outage failed: {exc}")
                return
            if got != want:
                load.wrong(f"{who}: a file open before the outage read {len(got or b'')} wrong bytes")
                return
            load.count(who)


@pytest.fixture
def sessions_conf(tmp_path: Path) -> list[str]:
    cfg = tmp_path / "sessions.toml"
    cfg.write_text(f"session_timeout = {SESSION_TIMEOUT}\n")
    return ["--config", str(cfg)]



@pytest.mark.slow
@pytest.mark.allow_log_errors  # the outage: failed commits, sessions gone and registered again
@pytest.mark.allow_log_warnings()
def test_the_database_stopped_under_load_on_two_nodes_loses_and_mixes_nothing(
    ckpt_factory: CkptFactory, postgres: PgServer, pg_url: str, remote: tuple[str, str],
    sessions_conf: list[str], db: Callable[[], PostgresCatalog],
) -> None:
    cluster = Cluster(ckpt_factory, pg_url, remote[0])
    a, b = cluster.node("a", *sessions_conf), cluster.node("b", *sessions_conf)
    nodes = {"a": a, "b": b}
    rng = random.Random(14)
    bufs = [os.urandom(rng.randrange(1, 3 * CS + 1000)) for _ in range(16)]
    (a.mountpoint / "load").mkdir()
    before = os.urandom(3 * CS + 777)
    (a.mountpoint / "before.bin").write_bytes(before)
    sync(a, a.mountpoint / "before.bin")  # on the bucket: b reads it from there
    wait_until(lambda: (b.mountpoint / "load").is_dir(), 5, "b sees the directory")
    pre_ino = os.stat(a.mountpoint / "before.bin").st_ino

    load = Load()
    threads: list[threading.Thread] = []
    for n, m in nodes.items():
        for w in range(WRITERS_PER_NODE):
            who = f"{n}{w}"
            load.histories[who] = History()
            threads.append(threading.Thread(target=writer, daemon=True,
                                            args=(load, m, who, bufs, random.Random(who))))
        threads.append(threading.Thread(target=reader, daemon=True,
                                        args=(load, m, f"{n}-reader", m.mountpoint / "before.bin",
                                              before)))
    writers = [w for w in load.histories]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: all(load.ok.get(w, 0) >= 3 for w in writers), 60,
                   "every writer commits before the outage")
        readers = [f"{n}-reader" for n in nodes]
        read_before = {r: load.ok.get(r, 0) for r in readers}
        postgres.stop()
        try:
            stopped = time.monotonic()
            # The outage has reached every writer, and outlasted the session timeout.
            wait_until(lambda: all(load.eio.get(w, 0) >= 2 for w in writers), 60,
                       "every writer sees the outage")
            wait_until(lambda: time.monotonic() - stopped > 2 * SESSION_TIMEOUT, 30,
                       "the sessions expire meanwhile")
            ok_during = dict(load.ok)
            # The files open before it read on (bit-identical, checked by the readers).
            wait_until(lambda: all(load.ok.get(r, 0) > read_before[r] + 2 for r in readers), 30,
                       "the open files read during the outage")
        finally:
            postgres.start()
        back = db().database_now_ns()
        wait_until(lambda: all(load.ok.get(w, 0) >= ok_during.get(w, 0) + 3 for w in writers),
                   90, "every writer commits again after the outage")
        # The sessions are registered (again) and beat; the readers' open file is noted.
        wait_until(lambda: {s.node for s in db().sessions() if s.live and s.beat_ns > back}
                   == {"a", "b"}, 30, "both sessions live again")
        wait_until(lambda: pre_ino in db().open_inodes(), 10, "the open file noted again")
    finally:
        load.stop.set()
        for t in threads:
            t.join(3 * BOUND_S)
    assert not [t.name for t in threads if t.is_alive()], "a system call hung"
    # Every file is closed now: no node's session still notes one open (closes during the
    # outage are noted after a heartbeat), so retention and the last-closer drop see them.
    try:
        wait_until(lambda: not db().open_inodes(), 10, "every close noted in the catalog")
    except AssertionError:
        nodes_of = {s.sid: s.node for s in db().sessions()}
        with psycopg.connect(pg_url) as conn:
            rows = conn.execute("SELECT sid, ino, writing FROM open_handles").fetchall()
        raise AssertionError("still noted open: " + ", ".join(
            f"{db().path_of(ino)} ({ino}) by {nodes_of.get(sid, sid)}{' writing' if w else ''}"
            for sid, ino, w in rows)) from None
    assert not load.problems, load.problems[:20]
    assert all(load.eio.get(w, 0) for w in writers)  # the outage was real for each
    assert max(load.slowest.values()) <= BOUND_S, load.slowest
    assert pid_alive(a.pid or -1) and pid_alive(b.pid or -1)

    # Afterwards, on both nodes: what a close committed is there bit-identical, a failed
    # version never replaced it with other bytes.
    sync(a, a.mountpoint / "load")
    for m in (a, b):
        listed = set(os.listdir(m.mountpoint / "load"))
        for hist in load.histories.values():
            for name in hist.versions:
                good, allowed = hist.allowed(name)
                if name not in listed:
                    assert good is None, f"{name} lost on {m.mountpoint.parent.name}"
                    continue
                got = (m.mountpoint / "load" / name).read_bytes()
                if good is not None and got != good:
                    assert got in allowed[1:], (
                        f"{name} on {m.mountpoint.parent.name}: {len(got)} bytes, not its last "
                        f"good version ({len(good)})")
                else:
                    assert got in allowed, f"{name} on {m.mountpoint.parent.name}: wrong bytes"
    # New files work on both nodes, and each node reads the other's.
    for here, there in ((a, b), (b, a)):
        data = os.urandom(2 * CS + 3)
        p = f"after-{here.mountpoint.parent.name}.bin"
        (here.mountpoint / p).write_bytes(data)
        sync(here, here.mountpoint / p)
        assert (there.mountpoint / p).read_bytes() == data


def test_while_the_database_is_down_every_call_after_the_first_fails_fast(
    postgres: PgServer, pg_url: str,
) -> None:
    """Each call that waited POOL_WAIT held a catalog slot that long: under load a file
    system call queued behind several of them (25 s seen). Once a call found the database
    unreachable, the next ones wait DOWN_WAIT; the first that reaches it ends that."""
    cat = PostgresCatalog(pg_url, pool_size=4)
    try:
        cat.get_inode(1)
        postgres.stop()
        try:
            took = []
            for _ in range(6):  # more calls than pooled connections
                t0 = time.monotonic()
                with pytest.raises(CatalogUnavailable):
                    cat.get_inode(1)
                took.append(time.monotonic() - t0)
            assert took[0] <= POOL_WAIT + CONNECT_TIMEOUT + 1, took
            assert max(took[1:]) <= DOWN_WAIT + 1, took
        finally:
            postgres.start()
        wait_until(lambda: _answers(cat), 10, "the catalog answers again")
        t0 = time.monotonic()
        cat.create(1, b"after", 0o100644, 0, 0)
        assert time.monotonic() - t0 < 1
    finally:
        cat.close()


def _answers(cat: PostgresCatalog) -> bool:
    try:
        cat.get_inode(1)
        return True
    except CatalogUnavailable:
        return False
