"""Namespace keys (issue 15; docs/governance.md "Encryption at rest and keys"): the SQL,
once for every engine.

A row of ``namespace_keys`` is one version of an encrypted namespace's data key, stored
only wrapped (AES-256-GCM under the key-encryption key, keys/wrap.py): no key material is
in the catalog, its snapshots or the bucket in clear. ``key_id`` is the number the frame
header carries; it is never reused, so a shredded row stays as a tombstone (``wrapped``
NULL, ``shredded_ns`` set) and a frame sealed under it can never be opened by a later key.
``kek_id`` is a fingerprint of the KEK that wrapped it (keys/kek.py), so a mount with the
wrong KEK is told which it needs. ``keys_gen`` in meta counts key changes: daemons reload
their keys when it moves (another node's rotation or shred).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .conn import Conn, SqlBase

__all__ = ["KEYS_DDL", "KeyRow", "KeysSql", "Wrap"]

KEYS_DDL = """
-- Versions of encrypted namespaces' data keys, wrapped by the KEK (catalog/keys.py);
-- a shredded version keeps its row (key ids are never reused) without its key.
CREATE TABLE IF NOT EXISTS namespace_keys (
    key_id      INTEGER NOT NULL PRIMARY KEY,
    namespace   TEXT NOT NULL,
    version     INTEGER NOT NULL,
    wrapped     BLOB,
    kek_id      TEXT NOT NULL,
    created_ns  INTEGER NOT NULL,
    shredded_ns INTEGER,
    UNIQUE (namespace, version)
);
"""

_COLS = "key_id, namespace, version, wrapped, kek_id, created_ns, shredded_ns"
_BUMP = ("INSERT INTO meta VALUES ('keys_gen', '1') ON CONFLICT (key) DO UPDATE SET "
         "value=CAST(CAST(meta.value AS INTEGER) + 1 AS TEXT)")

# wrap(namespace, version) -> (wrapped blob, kek id): runs inside the transaction (pure CPU).
Wrap = Callable[[str, int], tuple[bytes, str]]


@dataclass(frozen=True)
class KeyRow:
    key_id: int
    namespace: str
    version: int
    wrapped: bytes | None  # None: shredded
    kek_id: str
    created_ns: int
    shredded_ns: int | None

    @property
    def shredded(self) -> bool:
        return self.wrapped is None


def _row(r: Any) -> KeyRow:
    return KeyRow(int(r[0]), str(r[1]), int(r[2]), None if r[3] is None else bytes(r[3]),
                  str(r[4]), int(r[5]), None if r[6] is None else int(r[6]))


class KeysSql(SqlBase):
    """The key methods of SqlCatalog."""

    def namespace_keys(self, namespace: str | None = None) -> list[KeyRow]:
        """Every key version (with tombstones), of one namespace or all, by key id."""
        with self._reading() as c:
            if namespace is None:
                rows = c.execute(f"SELECT {_COLS} FROM namespace_keys ORDER BY key_id").fetchall()
            else:
                rows = c.execute(f"SELECT {_COLS} FROM namespace_keys WHERE namespace=? "
                                 "ORDER BY key_id", (namespace,)).fetchall()
        return [_row(r) for r in rows]

    def keys_gen(self) -> int:
        """The key change counter (0: no key was ever made)."""
        with self._reading() as c:
            row = c.execute("SELECT value FROM meta WHERE key='keys_gen'").fetchone()
        return 0 if row is None else int(row[0])

    def _add_version(self, c: Conn, namespace: str, wrap: Wrap) -> KeyRow:
        top = c.execute("SELECT coalesce(max(key_id), 0) FROM namespace_keys").fetchone()
        ver = c.execute("SELECT coalesce(max(version), 0) FROM namespace_keys WHERE namespace=?",
                        (namespace,)).fetchone()
        key_id, version = int(top[0]) + 1, int(ver[0]) + 1
        blob, kek_id = wrap(namespace, version)
        now = time.time_ns()
        c.execute(f"INSERT INTO namespace_keys ({_COLS}) VALUES (?, ?, ?, ?, ?, ?, NULL)",
                  (key_id, namespace, version, blob, kek_id, now))
        c.execute(_BUMP)
        return KeyRow(key_id, namespace, version, blob, kek_id, now, None)

    def ensure_namespace_key(self, namespace: str, wrap: Wrap) -> KeyRow | None:
        """Make the namespace's first key version (or a new one after a shred) unless it
        has a live one: one transaction, so of several nodes only the first creates it and
        the others use it. Returns the row made, or None if there was one."""

        def body(c: Conn) -> KeyRow | None:
            live = c.execute("SELECT 1 FROM namespace_keys WHERE namespace=? AND wrapped IS NOT "
                             "NULL", (namespace,)).fetchone()
            return None if live is not None else self._add_version(c, namespace, wrap)

        return self._write(body, synced=True)

    def rotate_namespace_key(self, namespace: str, wrap: Wrap) -> KeyRow:
        """A new version of the namespace's key: new chunks are sealed with it."""
        return self._write(lambda c: self._add_version(c, namespace, wrap), synced=True)

    def rewrap_keys(self, rewrap: Callable[[KeyRow], tuple[bytes, str]]) -> int:
        """Every live key version wrapped anew (a new KEK): one transaction, all or none."""

        def body(c: Conn) -> int:
            rows = [_row(r) for r in c.execute(
                f"SELECT {_COLS} FROM namespace_keys WHERE wrapped IS NOT NULL ORDER BY key_id"
            ).fetchall()]
            for row in rows:
                blob, kek_id = rewrap(row)
                c.execute("UPDATE namespace_keys SET wrapped=?, kek_id=? WHERE key_id=?",
                          (blob, kek_id, row.key_id))
            c.execute(_BUMP)
            return len(rows)

        return self._write(body, synced=True)

    def shred_namespace_keys(self, namespace: str) -> list[int]:
        """Destroy every key version of ``namespace`` (the rows stay as tombstones):
        returns the key ids shredded now."""

        def body(c: Conn) -> list[int]:
            ids = [int(r[0]) for r in c.execute(
                "SELECT key_id FROM namespace_keys WHERE namespace=? AND wrapped IS NOT NULL",
                (namespace,)).fetchall()]
            if ids:
                c.execute("UPDATE namespace_keys SET wrapped=NULL, shredded_ns=? WHERE "
                          "namespace=? AND wrapped IS NOT NULL", (time.time_ns(), namespace))
                c.execute(_BUMP)
            return ids

        return self._write(body, synced=True, touch=True)
