"""Events of the deletion queue that other nodes wait for (docs/multinode.md): the
channels, and the engine hooks that announce and hear them.

With a shared catalog a node waits for deletion rows another node writes or ends:

* its deleter for rows queued for its local tiers (another node's retention or unlink
  dropped chunks it holds), for remote rows any node may take, and for the end of rows it
  settles on (Deleter.settle) that another node deletes or claimed;
* its uploader for upload jobs held by another node's claim of the pair's remote
  deletion (uploads._CLAIMED): they may run once the claim ends.

The catalog's SQL (deletion_queue.py, contents.py, uploads.py, ...) calls ``_notify_deletions`` (rows queued, made due, or ended) and ``_notify_held``
(a claim ended while an upload job of its pair waited) at most once per transaction. On
PostgreSQL they are a NOTIFY, delivered to every listening session when the transaction
commits (never if it rolls back: its rerun notifies); SQLite has one node, whose deleter
and uploader are kicked in-process, and sends nothing. ``listen_deletions`` and
``listen_held_uploads`` give a node a listener of its own per channel (None on SQLite).
A claim that nobody ends (its node died) is no event: its lease's end is a deadline
(next_upload_due_ns, next_deletion_due_ns).
"""

from __future__ import annotations

from typing import Protocol

from .conn import Conn, SqlBase

__all__ = ["DELETIONS_CHANNEL", "HELD_CHANNEL", "DeletionEventsSql", "Listener"]

DELETIONS_CHANNEL = "ckptfs_deletions"
HELD_CHANNEL = "ckptfs_held_uploads"


class Listener(Protocol):
    """Where a node hears a channel (PostgreSQL: a dedicated LISTEN connection). ``wait``
    blocks (a worker thread) until an event may have happened since the last return: a
    notification, or a (re)connection, after which notifications sent meanwhile are
    unknown (the caller reads the catalog again); False once ``close`` (any thread) ended
    it. Raises CatalogUnavailable while the database cannot be reached."""

    def wait(self) -> bool:
        ...

    def close(self) -> None:
        ...


class DeletionEventsSql(SqlBase):
    """The hooks of SqlCatalog's deletion queue; an engine with other nodes overrides
    them (postgres.py). The defaults: one node, nobody to tell."""

    def _notify_deletions(self, c: Conn) -> None:
        """At this transaction's commit, tell the other nodes' deleters that deletion rows
        were queued, made due, or ended."""

    def _notify_held(self, c: Conn) -> None:
        """At this transaction's commit, tell the other nodes' uploaders that a claim
        ended while an upload job of its pair waited for it."""

    def listen_deletions(self) -> Listener | None:
        """A listener for ``_notify_deletions`` (its own connection); None: no other node."""
        return None

    def listen_held_uploads(self) -> Listener | None:
        """A listener for ``_notify_held`` (its own connection); None: no other node."""
        return None
