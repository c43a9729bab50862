"""Restore drills' records (schema 10; ckptfs/drill/, docs/operations.md "Restore
drills"): the SQL, once for every engine. One row per drill, written with its audit
record in one transaction; ``ckptfs status`` and the daemon's metrics read them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .audit import AuditRecord, AuditSql
from .conn import Conn

__all__ = ["DRILLS_DDL", "DrillCatalog", "DrillRow", "DrillsSql"]

DRILLS_DDL = """
-- Restore drills (catalog/drills.py): the latest committed checkpoint of a run restored
-- from the remote tier alone, verified and format-checked, result 'passed' or 'failed'.
CREATE TABLE IF NOT EXISTS drills (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run         TEXT NOT NULL,
    checkpoint  TEXT NOT NULL,  -- '' when the run had no committed checkpoint
    node        TEXT NOT NULL,
    uid         INTEGER NOT NULL,  -- the principal whose access rules the drill read with
    gid         INTEGER NOT NULL,
    started_ns  INTEGER NOT NULL,
    duration_ns INTEGER NOT NULL,
    bytes       INTEGER NOT NULL,  -- restored and verified
    total_bytes INTEGER NOT NULL,  -- the checkpoint's size
    result      TEXT NOT NULL CHECK (result IN ('passed', 'failed')),
    problem     TEXT NOT NULL DEFAULT ''  -- the first problem found
);
CREATE INDEX IF NOT EXISTS drills_run ON drills (run, id);
"""

_COLS = ("run, checkpoint, node, uid, gid, started_ns, duration_ns, bytes, total_bytes, "
         "result, problem")


@dataclass(frozen=True)
class DrillRow:
    """One drill. ``mb_per_s`` and ``implied_s`` (the restore time of the whole
    checkpoint at the drill's rate) are derived, never stored."""

    run: str
    checkpoint: str
    node: str
    uid: int
    gid: int
    started_ns: int
    duration_ns: int
    bytes: int
    total_bytes: int
    result: str
    problem: str = ""
    id: int = 0

    @property
    def passed(self) -> bool:
        return self.result == "passed"

    @property
    def mb_per_s(self) -> float:
        return self.bytes / (self.duration_ns / 1e9) / 1e6 if self.duration_ns > 0 else 0.0

    @property
    def implied_s(self) -> float | None:
        """Seconds a restore of the whole checkpoint takes at this drill's rate."""
        if self.bytes <= 0 or self.duration_ns <= 0:
            return None
        return self.total_bytes * (self.duration_ns / 1e9) / self.bytes

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "run": self.run, "checkpoint": self.checkpoint,
                "node": self.node, "uid": self.uid, "gid": self.gid,
                "started_ns": self.started_ns, "duration_s": self.duration_ns / 1e9,
                "bytes": self.bytes, "total_bytes": self.total_bytes,
                "mb_per_s": round(self.mb_per_s, 3),
                "implied_restore_s": None if self.implied_s is None else round(self.implied_s, 3),
                "result": self.result, "problem": self.problem}


def _row(r: Sequence[Any]) -> DrillRow:
    return DrillRow(str(r[1]), str(r[2]), str(r[3]), int(r[4]), int(r[5]), int(r[6]),
                    int(r[7]), int(r[8]), int(r[9]), str(r[10]), str(r[11]), int(r[0]))


class DrillCatalog(Protocol):
    """The drills' records."""

    def record_drill(self, row: DrillRow, *, audit: AuditRecord | None = None) -> int:
        """Store ``row`` (its ``id`` ignored) with ``audit`` in one transaction; its id."""
        ...

    def drill_rows(self, run: str | None = None, limit: int = 20) -> list[DrillRow]:
        """The newest drills (of ``run``; None: of every run), newest first."""
        ...

    def last_drills(self, result: str | None = None) -> list[DrillRow]:
        """The newest drill of each run (that ended with ``result``; None: any), by run."""
        ...


class DrillsSql(AuditSql):
    """The drill methods of SqlCatalog."""

    def record_drill(self, row: DrillRow, *, audit: AuditRecord | None = None) -> int:
        def body(c: Conn) -> int:
            got = c.execute(
                f"INSERT INTO drills ({_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "RETURNING id",
                (row.run, row.checkpoint, row.node, row.uid, row.gid, row.started_ns,
                 row.duration_ns, row.bytes, row.total_bytes, row.result, row.problem),
            ).fetchone()
            self._audit_in(c, audit, lambda: row.checkpoint or row.run)
            return int(got[0])

        return self._write(body)

    def drill_rows(self, run: str | None = None, limit: int = 20) -> list[DrillRow]:
        if run is None:
            rows = self._query(f"SELECT id, {_COLS} FROM drills ORDER BY id DESC LIMIT ?",
                               (limit,))
        else:
            rows = self._query(f"SELECT id, {_COLS} FROM drills WHERE run=? ORDER BY id DESC "
                               "LIMIT ?", (run, limit))
        return [_row(r) for r in rows]

    def last_drills(self, result: str | None = None) -> list[DrillRow]:
        where, params = ("", ()) if result is None else ("WHERE result=? ", (result,))
        rows = self._query(f"SELECT id, {_COLS} FROM drills WHERE id IN "
                           f"(SELECT max(id) FROM drills {where}GROUP BY run) ORDER BY run",
                           params)
        return [_row(r) for r in rows]
