"""Checkpoint rows' SQL, once for every engine: what the detectors record and retention
changes (protocols.CheckpointCatalog). A root is the bytes of its path (ckptfs/names.py).
What each method does is said on its Protocol; comments here say how."""

from __future__ import annotations

import json

from ..errors import InvalidArgument
from ..names import path_bytes, path_str, readable
from .audit import AuditRecord, AuditSql
from .conn import Conn
from .rows import CheckpointRow, CheckpointState

__all__ = ["CheckpointSql"]


class CheckpointSql(AuditSql):
    """The checkpoint-row methods of SqlCatalog."""

    def checkpoint_begin(
        self, root: str, framework: str, step: int | None, t_ns: int, *,
        keep_newer_commit: bool = False,
    ) -> bool:
        def body(c: Conn) -> bool:
            row = c.execute("SELECT state, commit_ns FROM checkpoints WHERE root=?",
                            (key,)).fetchone()
            if row is not None and row[0] == CheckpointState.WRITING:
                return False
            if (keep_newer_commit and row is not None and row[0] == CheckpointState.COMMITTED
                    and row[1] is not None and int(row[1]) >= t_ns):
                return False  # a write that the commit already covers, recorded late
            c.execute(
                "INSERT INTO checkpoints (root, framework, step, state, begin_ns) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (root) DO UPDATE SET "
                "framework=excluded.framework, step=excluded.step, state=excluded.state, "
                "begin_ns=excluded.begin_ns, commit_ns=NULL, reason=NULL",
                (key, framework, step, CheckpointState.WRITING.value, t_ns),
            )
            return True

        key = path_bytes(root)

        return self._write(body)

    def checkpoint_commit(
        self, root: str, framework: str, step: int | None, t_ns: int, reason: str, *,
        audit: AuditRecord | None = None,
    ) -> None:
        def body(c: Conn) -> None:
            c.execute(
                "INSERT INTO checkpoints (root, framework, step, state, begin_ns, commit_ns, reason) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (root) DO UPDATE SET "
                "framework=excluded.framework, step=coalesce(excluded.step, checkpoints.step), "
                "state=excluded.state, begin_ns=coalesce(checkpoints.begin_ns, excluded.begin_ns), "
                "commit_ns=excluded.commit_ns, reason=excluded.reason",
                (path_bytes(root), framework, step, CheckpointState.COMMITTED.value, t_ns, t_ns,
                 readable(reason)),
            )
            self._audit_in(c, audit, lambda: root, framework=framework, step=step, reason=reason)

        self._write(body, touch=True)

    def checkpoint_set_state(
        self, root: str, state: CheckpointState | str, reason: str | None = None, *,
        only_from: CheckpointState | None = None, audit: AuditRecord | None = None,
    ) -> bool:
        try:
            st = CheckpointState(state)
        except ValueError:
            raise InvalidArgument(f"checkpoint state {state!r}") from None

        def body(c: Conn) -> bool:
            if only_from is None:
                done = bool(c.execute(
                    "UPDATE checkpoints SET state=?, reason=coalesce(?, reason) WHERE root=?",
                    (st.value, text, key),
                ).rowcount)
            else:
                done = bool(c.execute(
                    "UPDATE checkpoints SET state=?, reason=coalesce(?, reason) "
                    "WHERE root=? AND state=?",
                    (st.value, text, key, CheckpointState(only_from).value),
                ).rowcount)
            if done:
                self._audit_in(c, audit, lambda: root, state=st.value, reason=reason)
            return done

        key, text = path_bytes(root), None if reason is None else readable(reason)

        return self._write(body, touch=True)

    def checkpoint_leftover(self, root: str, digests: list[bytes]) -> None:
        left = json.dumps([d.hex() for d in digests]) if digests else None

        def body(c: Conn) -> None:
            c.execute("UPDATE checkpoints SET leftover=? WHERE root=?", (left, path_bytes(root)))

        self._write(body)

    def expired_leftovers(self) -> dict[str, list[bytes]]:
        with self._reading() as c:
            rows = c.execute(
                "SELECT root, leftover FROM checkpoints WHERE state=? AND leftover IS NOT NULL",
                (CheckpointState.EXPIRED.value,),
            ).fetchall()
        return {path_str(r): [bytes.fromhex(h) for h in json.loads(v)] for r, v in rows}

    def checkpoint_tag(self, root: str, tag: str, *, audit: AuditRecord | None = None) -> bool:
        def body(c: Conn) -> bool:
            row = c.execute("SELECT tags FROM checkpoints WHERE root=?", (key,)).fetchone()
            if row is None:
                return False
            tags = {t for t in str(row[0]).split(",") if t} | {readable(tag)}
            c.execute("UPDATE checkpoints SET tags=? WHERE root=?", (",".join(sorted(tags)), key))
            self._audit_in(c, audit, lambda: root, tag=tag)
            return True

        key = path_bytes(root)

        return self._write(body, touch=True)

    def checkpoint_rows(self, under: str = "/") -> list[CheckpointRow]:
        # Roots are bytes (ckptfs/names.py): "under" compares the leading bytes, no pattern.
        prefix = path_bytes(under.rstrip("/")) + b"/"
        rows = self._query(
            "SELECT id, root, framework, step, state, begin_ns, commit_ns, reason, tags "
            "FROM checkpoints WHERE root = ? OR substr(root, 1, ?) = ? ORDER BY id",
            (prefix[:-1] or b"/", len(prefix), prefix),
        )
        return [
            CheckpointRow(int(i), path_str(root), str(fw), None if step is None else int(step),
                          CheckpointState(state), None if b is None else int(b),
                          None if cm is None else int(cm), None if why is None else str(why),
                          str(tags))
            for i, root, fw, step, state, b, cm, why, tags in rows
        ]

    def rename_checkpoints(self, old: str, new: str) -> None:
        under = "SELECT id, root FROM checkpoints WHERE root = ? OR substr(root, 1, ?) = ?"
        # Most renames (a file's, in a save or a rotation) move no checkpoint: a read
        # answers that, without a write transaction per renamed file. A row recorded
        # after this read is as late as one recorded after the transaction would be.
        src, dst = path_bytes(old), path_bytes(new)  # roots are bytes (ckptfs/names.py)
        args = (src, len(src) + 1, src + b"/")
        if not self._query(under, args):
            return

        def body(c: Conn) -> None:
            for cid, root in c.execute(under, args).fetchall():
                moved = dst + bytes(root)[len(src):]
                c.execute("DELETE FROM checkpoints WHERE root=? AND id<>?", (moved, cid))
                c.execute("UPDATE checkpoints SET root=? WHERE id=?", (moved, cid))

        self._write(body)
