"""The audit log (issue 15; docs/governance.md "Audit log"): an append-only, hash-chained
table of who did what, the SQL once for every engine, and the chain's encoding.

Each row of ``audit_log`` is one record: ``seq`` (1, 2, ... with no gap), the node's time,
node, uid, pid, action, path, ``detail`` (canonical JSON), ``prev`` (the digest of record
``seq - 1``; for record 1 the genesis value of this catalog) and ``digest`` = SHA-256 of the
record's canonical encoding (``record_bytes``), which covers ``prev``: changing, removing or
moving one record breaks every later link unless all of them are rewritten, and that is
what the signed seals of the head (upload/seal.py) catch.

A change is recorded in the transaction that makes it: a write method of SqlCatalog takes
``audit`` (an ``AuditRecord``) and its body calls ``_audit_in`` last. The next ``seq`` is
the head's plus one; ``seq`` is the primary key, so of two transactions that read the same
head one fails its insert and runs again: one total order without a lock of its own. Opens
for reading change nothing; they are noted in memory (``audit_note``, no I/O) and written
together by ``audit_flush`` in a transaction of their own (the daemon's flusher, mount.py).

A shared catalog (PostgreSQL, ``_audit_deferred``) records a change the same way, in its
transaction, but as a row of ``audit_pending`` (no seq, no digest yet): reading the one head
in every audited transaction of every node made them all conflict (issue 35). The records
are chained afterwards, oldest pending first, by ``chain_pending`` in a transaction of their
own that one node at a time runs (postgres.py ``_audit_chain``: the daemon's flusher a moment
after each audited change, and every read of the log, the seal's included, first). So a
change and its record still commit or vanish together, the chain keeps its format, and what
the seals cover is chained: records are unchained only until the next flush or read.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..names import readable
from .conn import Conn, SqlBase
from .hooks import CatalogHooks
from .tree import path_of

__all__ = [
    "AUDIT_DDL", "AUDIT_FORMAT", "AUDIT_PENDING_DDL", "chain_pending", "AuditEntry", "AuditProblem", "AuditRecord", "AuditSql",
    "canonical_json", "genesis", "record_bytes", "record_digest", "verify_chain",
]

AUDIT_FORMAT = b"ckptfs-audit-1"  # the first field of every encoded record

AUDIT_DDL = """
-- The audit log (catalog/audit.py): append-only, each record chained to the one before
-- by prev (the previous record's digest) and sealed by signed heads on the remote tier.
CREATE TABLE IF NOT EXISTS audit_log (
    seq     INTEGER PRIMARY KEY,  -- 1, 2, ...: the order of the records (no gap)
    time_ns INTEGER NOT NULL,     -- the recording node's clock
    node    TEXT NOT NULL,
    uid     INTEGER NOT NULL,
    pid     INTEGER NOT NULL,
    action  TEXT NOT NULL,
    path    TEXT NOT NULL,
    detail  TEXT NOT NULL,        -- canonical JSON (canonical_json)
    prev    BLOB NOT NULL,
    digest  BLOB NOT NULL
);
"""

# The records of a shared catalog not chained yet (module doc): what a record holds but seq,
# prev and digest; ``id`` orders them (the order they were appended in, nearly).
AUDIT_PENDING_DDL = """
CREATE TABLE IF NOT EXISTS audit_pending (
    id      BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    time_ns BIGINT NOT NULL,
    node    TEXT NOT NULL,
    uid     BIGINT NOT NULL,
    pid     BIGINT NOT NULL,
    action  TEXT NOT NULL,
    path    TEXT NOT NULL,
    detail  TEXT NOT NULL
)
"""

# Pending records moved into the chain per statement (chain_pending).
CHAIN_BATCH = 1000
# Records per INSERT INTO audit_log: 50 parameters at most, so that psycopg caches the
# statement's parsing (it parses one with more every time).
_INSERT_ROWS = 5

# The open-for-read records noted and not yet written: beyond this many (a catalog down for
# long) the oldest are dropped, and the next flush records how many.
BACKLOG_MAX = 100_000


def canonical_json(detail: Mapping[str, Any]) -> str:
    """``detail`` as the log stores and hashes it: sorted keys, no spaces, ASCII only."""
    return json.dumps(dict(detail), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def genesis(fs_id: str) -> bytes:
    """The ``prev`` of record 1: fixed per catalog (its ``fs_id``), so a log cannot be
    passed off as another file system's."""
    return hashlib.sha256(b"ckptfs audit genesis\0" + fs_id.encode()).digest()


def record_bytes(seq: int, time_ns: int, node: str, uid: int, pid: int, action: str,
                 path: str, detail: str, prev: bytes) -> bytes:
    """The canonical encoding of a record: each field, in this order, as a 4-byte
    big-endian length and its bytes (integers in decimal ASCII, text in UTF-8)."""
    out = bytearray()
    for part in (AUDIT_FORMAT, str(seq).encode(), str(time_ns).encode(), node.encode(),
                 str(uid).encode(), str(pid).encode(), action.encode(), path.encode(),
                 detail.encode(), bytes(prev)):
        out += len(part).to_bytes(4, "big") + part
    return bytes(out)


def record_digest(seq: int, time_ns: int, node: str, uid: int, pid: int, action: str,
                  path: str, detail: str, prev: bytes) -> bytes:
    return hashlib.sha256(
        record_bytes(seq, time_ns, node, uid, pid, action, path, detail, prev)).digest()


@dataclass(frozen=True)
class AuditRecord:
    """What a caller records: the action, on what, by whom. ``path`` None: the catalog
    fills in the path of ``ino`` (or of the entry the write method changes) as the
    transaction sees it. ``time_ns`` 0: the time of the append. The daemon's own work
    (retention, eviction, the tracker) is uid 0, pid 0."""

    action: str
    path: str | None = None
    uid: int = 0
    pid: int = 0
    detail: Mapping[str, Any] = field(default_factory=dict)
    ino: int | None = None
    time_ns: int = 0


@dataclass(frozen=True)
class AuditEntry:
    """A stored record."""

    seq: int
    time_ns: int
    node: str
    uid: int
    pid: int
    action: str
    path: str
    detail: str
    prev: bytes
    digest: bytes

    def computed_digest(self, seq: int | None = None) -> bytes:
        return record_digest(self.seq if seq is None else seq, self.time_ns, self.node,
                             self.uid, self.pid, self.action, self.path, self.detail, self.prev)

    def as_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "time_ns": self.time_ns, "node": self.node, "uid": self.uid,
                "pid": self.pid, "action": self.action, "path": self.path,
                "detail": json.loads(self.detail), "prev": self.prev.hex(),
                "digest": self.digest.hex()}


@dataclass(frozen=True)
class AuditProblem:
    """One break of the chain: ``kind`` is "edited", "missing", "reordered" or "head"
    (a seal names a head the log does not hold), at ``seq`` (to ``last`` for a range)."""

    kind: str
    seq: int
    last: int | None = None
    message: str = ""


def verify_chain(entries: Iterable[AuditEntry], first_prev: bytes) -> list[AuditProblem]:
    """Every break of the chain ``entries`` (ordered by seq), whose record 1 names
    ``first_prev``. An edited record fails its own digest; a deleted one leaves a gap in
    seq; records moved to other seqs hash right under the seq they were written as."""
    rows = list(entries)
    by_digest = {bytes(e.digest): e.seq for e in rows}
    problems: list[AuditProblem] = []
    expected_seq, prev, explained = 1, first_prev, False
    for e in rows:
        flagged = len(problems)
        if e.seq > expected_seq:
            problems.append(AuditProblem(
                "missing", expected_seq, e.seq - 1,
                f"records {expected_seq}..{e.seq - 1} are missing (deleted)"
                if e.seq - 1 > expected_seq else f"record {expected_seq} is missing (deleted)"))
        good = e.computed_digest() == e.digest
        if not good:
            # Written as another seq? Its predecessor (by its own prev) tells which.
            written = by_digest.get(bytes(e.prev), 0) + 1 if e.prev != first_prev else 1
            if written != e.seq and e.computed_digest(written) == e.digest:
                problems.append(AuditProblem(
                    "reordered", e.seq, None,
                    f"record at seq {e.seq} is record {written} moved (reordered)"))
            else:
                problems.append(AuditProblem("edited", e.seq, None,
                                             f"record {e.seq} was edited (its digest does not match)"))
        elif e.prev != prev and e.seq == expected_seq and not explained:
            problems.append(AuditProblem(
                "edited", e.seq, None,
                f"record {e.seq} does not follow record {e.seq - 1} (prev digest differs: "
                f"record {e.seq - 1} was edited or replaced)"))
        # A link broken next to a record already reported is explained by it.
        explained = len(problems) > flagged
        expected_seq, prev = e.seq + 1, bytes(e.digest)
    return problems


class AuditSql(SqlBase):
    """The audit methods of SqlCatalog. This node's name in the records is the hooks'
    ``node``; their ``on_audit_note`` (the daemon's flusher's wake) is called in the
    noting thread after each ``audit_note``."""

    def __init__(self, hooks: CatalogHooks | None = None) -> None:
        super().__init__(hooks)
        self._audit_lock = threading.Lock()
        self._audit_backlog: list[AuditRecord] = []  # noted, not yet written
        self._audit_dropped = 0  # noted and dropped (BACKLOG_MAX)

    # Records go to audit_pending and are chained later (a shared catalog: module doc).
    _audit_deferred = False

    # Read from the hooks given at open.
    @property
    def audit_node(self) -> str:
        return self.hooks.node

    @property
    def on_audit_note(self) -> Callable[[], None] | None:
        return self.hooks.on_audit_note

    # -- appending ---------------------------------------------------------------------------

    def _audit_in(self, c: Conn, records: AuditRecord | Sequence[AuditRecord] | None,
                  path: Callable[[], str] | None = None, **detail: Any) -> None:
        """Append ``records`` to the chain in the caller's transaction (nothing if None).
        A record without a path gets ``path()`` (the entry the write changed), or its
        ino's path; ``detail`` is added to each record's."""
        if records is None:
            return
        todo = [records] if isinstance(records, AuditRecord) else list(records)
        if not todo:
            return
        if self._audit_deferred:
            self._audit_pend(c, todo, path, detail)
            return
        seq, prev = _head(c)
        now = time.time_ns()
        node = self.hooks.node
        for r in todo:
            where = r.path
            if where is None:
                where = (path_of(c, r.ino) if r.ino is not None
                         else path() if path is not None else "")
            # Names that are not UTF-8: their bytes escaped, so the text stores and hashes.
            where = readable(where)
            extra = dict(r.detail)
            extra.update(detail)
            if r.ino is not None:
                extra.setdefault("ino", r.ino)
            text = canonical_json(extra)
            t_ns = r.time_ns or now
            seq += 1
            digest = record_digest(seq, t_ns, node, r.uid, r.pid, r.action, where, text, prev)
            c.execute(
                "INSERT INTO audit_log (seq, time_ns, node, uid, pid, action, path, detail, "
                "prev, digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (seq, t_ns, node, r.uid, r.pid, r.action, where, text, prev, digest),
            )
            prev = digest

    def _audit_pend(self, c: Conn, todo: Sequence[AuditRecord], path: Callable[[], str] | None,
                    detail: Mapping[str, Any]) -> None:
        """The shared catalog's ``_audit_in``: the records as pending rows (module doc),
        chained by the flusher, which this wakes."""
        now = time.time_ns()
        for r in todo:
            where = r.path
            if where is None:
                where = (path_of(c, r.ino) if r.ino is not None
                         else path() if path is not None else "")
            extra = dict(r.detail)
            extra.update(detail)
            if r.ino is not None:
                extra.setdefault("ino", r.ino)
            c.execute("INSERT INTO audit_pending (time_ns, node, uid, pid, action, path, detail) "
                      "VALUES (?, ?, ?, ?, ?, ?, ?)",
                      (r.time_ns or now, self.hooks.node, r.uid, r.pid, r.action, readable(where),
                       canonical_json(extra)))
        woke = self.hooks.on_audit_pending
        if woke is not None:
            woke()

    def _audit_chain(self) -> int:
        """Chain the pending records (a shared catalog's engine; none elsewhere); how many."""
        return 0

    def audit_append(self, records: AuditRecord | Sequence[AuditRecord]) -> None:
        """Append ``records`` in a transaction of their own (an event that changes no
        other row: a refusal, an admin override, a prefetch, a key change)."""
        self._write(lambda c: self._audit_in(c, records))

    def audit_note(self, record: AuditRecord) -> None:
        """Note a record to be written by the next ``audit_flush`` (an open for reading:
        no catalog write on the open's path). Thread-safe, no I/O."""
        with self._audit_lock:
            if len(self._audit_backlog) >= BACKLOG_MAX:
                del self._audit_backlog[0]
                self._audit_dropped += 1
            self._audit_backlog.append(record)
        woke = self.hooks.on_audit_note
        if woke is not None:
            woke()

    def audit_pending(self) -> int:
        """How many noted records wait for ``audit_flush``."""
        return len(self._audit_backlog)

    def audit_flush(self) -> int:
        """Write every noted record in one transaction; how many. If the transaction fails
        they stay noted (ahead of newer ones) and the error is raised."""
        with self._audit_lock:
            todo, self._audit_backlog = self._audit_backlog, []
            dropped, self._audit_dropped = self._audit_dropped, 0
        if dropped:
            todo.append(AuditRecord("audit_lost", "/", detail={"records": dropped}))
        if not todo:
            self._audit_chain()  # the changes' records pending (a shared catalog)
            return 0
        try:
            self.audit_append(todo)
        except BaseException:
            with self._audit_lock:
                self._audit_backlog[:0] = [r for r in todo if r.action != "audit_lost"]
                self._audit_dropped += dropped
            raise
        self._audit_chain()
        return len(todo)

    # -- reading -----------------------------------------------------------------------------

    def audit_genesis(self) -> bytes:
        rows = self._query("SELECT value FROM meta WHERE key='fs_id'")
        return genesis(str(rows[0][0]) if rows else "")

    def audit_head(self) -> AuditEntry | None:
        self._audit_chain()
        rows = self._query(f"SELECT {_COLS} FROM audit_log ORDER BY seq DESC LIMIT 1")
        return _entry(rows[0]) if rows else None

    def audit_entries(self, since_seq: int = 0, since_ns: int | None = None,
                      limit: int | None = None, last: int | None = None) -> list[AuditEntry]:
        """Records with seq >= ``since_seq`` (and time >= ``since_ns``), oldest first;
        ``last``: only the newest that many."""
        self._audit_chain()
        where, args = "seq >= ?", [since_seq]
        if since_ns is not None:
            where += " AND time_ns >= ?"
            args.append(since_ns)
        if last is not None:
            rows = self._query(f"SELECT {_COLS} FROM audit_log WHERE {where} "
                               "ORDER BY seq DESC LIMIT ?", (*args, last))
            return [_entry(r) for r in reversed(rows)]
        sql = f"SELECT {_COLS} FROM audit_log WHERE {where} ORDER BY seq"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [_entry(r) for r in self._query(sql, args)]


_COLS = "seq, time_ns, node, uid, pid, action, path, detail, prev, digest"


def _head(c: Conn) -> tuple[int, bytes]:
    """The seq and digest of the chain's head (0 and the genesis value if empty)."""
    row = c.execute("SELECT seq, digest FROM audit_log ORDER BY seq DESC LIMIT 1").fetchone()
    if row is None:
        fs_id = c.execute("SELECT value FROM meta WHERE key='fs_id'").fetchone()
        return 0, genesis("" if fs_id is None else str(fs_id[0]))
    return int(row[0]), bytes(row[1])


def chain_pending(c: Conn) -> int:
    """Move the pending records into the chain, oldest first, in the caller's transaction,
    which must be the only one chaining (postgres.py holds a lock); how many."""
    moved = 0
    while True:
        rows = sorted(c.execute(
            "DELETE FROM audit_pending WHERE id IN (SELECT id FROM audit_pending ORDER BY id "
            "LIMIT ?) RETURNING id, time_ns, node, uid, pid, action, path, detail",
            (CHAIN_BATCH,)).fetchall())
        if not rows:
            return moved
        seq, prev = _head(c)
        values: list[Any] = []
        for _id, t_ns, node, uid, pid, action, path, detail in rows:
            seq += 1
            digest = record_digest(seq, int(t_ns), str(node), int(uid), int(pid), str(action),
                                   str(path), str(detail), prev)
            values.append((seq, int(t_ns), str(node), int(uid), int(pid), str(action),
                           str(path), str(detail), prev, digest))
            prev = digest
        for at in range(0, len(values), _INSERT_ROWS):
            part = values[at:at + _INSERT_ROWS]
            c.execute(f"INSERT INTO audit_log ({_COLS}) VALUES "
                      + ",".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * len(part)),
                      [v for row in part for v in row])
        moved += len(rows)
        if len(rows) < CHAIN_BATCH:
            return moved


def _entry(r: Sequence[Any]) -> AuditEntry:
    return AuditEntry(int(r[0]), int(r[1]), str(r[2]), int(r[3]), int(r[4]), str(r[5]),
                      str(r[6]), str(r[7]), bytes(r[8]), bytes(r[9]))


def with_detail(record: AuditRecord | None, **detail: Any) -> AuditRecord | None:
    """``record`` with ``detail`` added (None stays None)."""
    if record is None:
        return None
    return replace(record, detail={**record.detail, **detail})
