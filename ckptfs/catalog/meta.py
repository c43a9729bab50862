"""Meta's SQL, once for every engine: key/value rows (fs id, recorded tiers, snapshot
times), a sync, and turning a restored snapshot into this node's catalog
(protocols.MetaCatalog). What each method does is said on its Protocol; comments here say
how."""

from __future__ import annotations

import json
import time

from .conn import Conn, SqlBase
from .quotas import uncharge_inode
from .tree import path_of

__all__ = ["MetaSql"]

_SET_META = "INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value=excluded.value"


class MetaSql(SqlBase):
    """The meta methods of SqlCatalog."""

    @staticmethod
    def _get_meta(c: Conn, key: str) -> str | None:
        row = c.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def get_meta(self, key: str) -> str | None:
        rows = self._query("SELECT value FROM meta WHERE key=?", (key,))
        return str(rows[0][0]) if rows else None

    def set_meta(self, key: str, value: str) -> None:
        self._write(lambda c: c.execute(_SET_META, (key, value)))

    def recorded_tiers(self) -> list[dict[str, str]]:
        raw = self.get_meta("tiers")
        return [] if raw is None else list(json.loads(raw))

    def sync(self) -> None:
        self._write(lambda c: c.execute(_SET_META, ("last_sync_ns", str(time.time_ns()))), synced=True)

    def snapshot_of_ns(self) -> int | None:
        taken = self.get_meta("snapshot_of_ns")
        return None if taken is None else int(taken)

    def snapshot_is_current(self) -> bool:
        with self._reading() as c:
            changed = self._get_meta(c, "changed_ns")
            taken = self._get_meta(c, "snapshot_of_ns")
        return changed is None or (taken is not None and int(taken) >= int(changed))

    def adopt_snapshot(self, remote_tiers: list[str]) -> tuple[int, list[str]]:
        recorded = {t["name"]: t.get("kind", "local") for t in self.recorded_tiers()}
        snap_remotes = [n for n, k in recorded.items() if k != "local"]
        # The chunks a remote held (read before the replica rows are replaced below).
        held = ("SELECT digest FROM replicas WHERE state='valid' AND tier IN "
                f"({','.join('?' * len(snap_remotes)) or 'NULL'})")

        def body(c: Conn) -> tuple[int, list[str]]:
            lost = [
                int(r[0]) for r in c.execute(
                    f"SELECT DISTINCT ino FROM extents WHERE digest NOT IN ({held})", snap_remotes
                ).fetchall()
            ]
            removed = [path_of(c, ino) for ino in lost]
            for ino in lost:
                for parent, in c.execute("SELECT parent FROM dentries WHERE ino=?", (ino,)).fetchall():
                    c.execute("UPDATE inodes SET mtime_ns=?, ctime_ns=? WHERE ino=?",
                              (time.time_ns(), time.time_ns(), parent))
                c.execute("DELETE FROM dentries WHERE ino=?", (ino,))
                c.execute("DELETE FROM extents WHERE ino=?", (ino,))
                c.execute("DELETE FROM xattrs WHERE ino=?", (ino,))
                uncharge_inode(c, ino)
                c.execute("DELETE FROM inodes WHERE ino=?", (ino,))
            c.execute(f"DELETE FROM chunks WHERE digest NOT IN ({held})", snap_remotes)
            c.execute("DELETE FROM upload_jobs")
            # Another node's queue: never delete on the strength of its rows (fsck finds
            # what is left over).
            c.execute("DELETE FROM deletions")
            # A remote the snapshot knows by name keeps its rows: which chunks it holds (the
            # scrubber would otherwise find every chunk "missing" on the remotes striping
            # left out). A remote it does not know may hold any chunk: reads try each.
            known = [t for t in remote_tiers if t in snap_remotes]
            if known:
                c.execute(f"DELETE FROM replicas WHERE tier NOT IN ({','.join('?' * len(known))})",
                          known)
            else:
                c.execute("DELETE FROM replicas")
            for tier in remote_tiers:
                if tier not in known:
                    c.execute("INSERT INTO replicas (digest, tier, state) SELECT digest, ?, "
                              "'valid' FROM chunks", (tier,))
            kept = int(c.execute(
                "SELECT count(*) FROM inodes WHERE mode & 61440 = 32768").fetchone()[0])
            return kept, removed

        return self._write(body, touch=True)
