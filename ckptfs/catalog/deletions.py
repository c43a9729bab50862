"""Writing a row of the deletion queue inside another transaction: the one helper every
module of the catalog that drops a copy uses (contents.py, uploads.py, replicas.py,
deletion_queue.py, moves.py, sessions.py)."""

from __future__ import annotations

from .conn import Conn

__all__ = ["queue_deletion"]


def queue_deletion(c: Conn, digest: bytes, tier: str, length: int, now: int) -> None:
    """Queue the frame of ``digest`` on ``tier`` for deletion (due at once again if it was
    queued already), unless claimed: that deleter's delete does what this row asks."""
    c.execute(
        "INSERT INTO deletions (digest, tier, length, enqueued_ns) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (digest, tier) DO UPDATE SET next_try_ns=CASE WHEN "
        "deletions.next_try_ns < 0 THEN deletions.next_try_ns ELSE 0 END",
        (digest, tier, length, now),
    )
