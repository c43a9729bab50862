"""PostgreSQL LISTEN on a connection of its own (not the pool's): how a node hears of
events other nodes announce with NOTIFY (wants.py: chunks another node waits for;
deletion_events.py: deletion rows queued or ended, claims' ends that held an upload).

``PgListener.wait`` blocks in a worker thread until a notification arrives on the channel
(True), or returns True at once after (re)connecting: notifications sent while no LISTEN
was active are lost, so the caller looks at the catalog then. ``close`` (any thread) wakes
it through a pipe: it returns False and closes its connection itself (a psycopg connection
is used by one thread at a time). A connection the server dropped (a restart) raises
CatalogUnavailable; the next ``wait`` connects again. NOTIFY is delivered to every session
listening when the notifying transaction commits, so between reconnections nothing is
missed: no periodic re-check is needed.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from collections.abc import Callable
from typing import Any

import psycopg

from ..errors import CatalogUnavailable

__all__ = ["PgListener"]


class PgListener:
    def __init__(
        self, url: str, kwargs: dict[str, Any], channel: str,
        unavailable: Callable[[BaseException], CatalogUnavailable],
    ) -> None:
        """``kwargs``: the pool's connection options (timeouts, keepalives, autocommit);
        ``unavailable``: the engine's error for an unreachable database (no password)."""
        self._url = url
        self._kwargs = {**kwargs, "autocommit": True}
        self._channel = channel
        self._unavailable = unavailable
        self._conn: psycopg.Connection[Any] | None = None
        self._wake_r, self._wake_w = os.pipe()  # close() wakes a wait through it
        self._fds: tuple[int, ...] = (self._wake_r, self._wake_w)
        self._lock = threading.Lock()  # _closed, _busy, the release (never held over I/O)
        self._closed = False
        self._busy = False  # a wait runs (in some thread)
        self.connects = 0  # how many times a LISTEN was (re)established (tests)

    def wait(self) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._busy = True
        try:
            return self._wait()
        finally:
            with self._lock:
                self._busy = False
                closed = self._closed
            if closed:
                self._release()

    def _wait(self) -> bool:
        try:
            if self._conn is None:
                self._conn = psycopg.connect(self._url, **self._kwargs)
                self._conn.execute(f"LISTEN {self._channel}")
                self.connects += 1
                return True  # what was sent before the LISTEN: look now
            pg = self._conn.pgconn
            while True:
                ready, _, _ = select.select([pg.socket, self._wake_r], [], [])
                if self._wake_r in ready:
                    return False  # closed
                pg.consume_input()  # raises if the server closed the connection
                got = False
                while pg.notifies() is not None:
                    got = True
                if got:
                    return True
        except (psycopg.OperationalError, psycopg.InterfaceError, OSError) as e:
            conn, self._conn = self._conn, None
            if conn is not None:
                with contextlib.suppress(psycopg.Error):
                    conn.close()
            raise self._unavailable(e) from None

    def _release(self) -> None:
        """Blocking: close the connection and the pipe (once; after ``close``)."""
        with self._lock:
            conn, self._conn = self._conn, None
            fds, self._fds = self._fds, ()
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()
        for fd in fds:
            os.close(fd)

    def close(self) -> None:
        """End the listener (blocking: may close the connection; call from a worker
        thread). A ``wait`` in progress returns False and releases the connection in
        its own thread; a later one returns False at once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            busy = self._busy
            if busy:
                os.write(self._wake_w, b"x")
        if not busy:
            self._release()
