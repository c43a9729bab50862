"""Refused access aggregated for the audit log (ckptfs/vfs/refusals.py), on trio's mock
clock: one record per (uid, namespace, operation) per window, with the count, written at
the window's end or at ``close``; the namespace rules (vfs/access.py) count each EACCES."""

from __future__ import annotations

import errno
import logging

import pytest
import trio
import trio.testing

from tests.unit.test_access import GOV, STRANGER, FakeCatalog, errno_of, who

from ckptfs.catalog.audit import AuditRecord
from ckptfs.vfs import refusals as refusals_mod
from ckptfs.vfs.access import Access
from ckptfs.vfs.refusals import Refusals

pytestmark = pytest.mark.allow_log_warnings("access refused")


class Noted:
    def __init__(self) -> None:
        self.records: list[AuditRecord] = []

    def audit_note(self, record: AuditRecord) -> None:
        self.records.append(record)


def counts(noted: Noted) -> dict[tuple[int, str, str], int]:
    out: dict[tuple[int, str, str], int] = {}
    for r in noted.records:
        key = (r.uid, str(r.detail["namespace"]), str(r.detail["op"]))
        out[key] = out.get(key, 0) + int(r.detail["count"])
    return out


async def test_one_record_per_key_and_window(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture,
) -> None:
    noted = Noted()
    r = Refusals(noted, window_s=10)  # type: ignore[arg-type]
    caplog.set_level(logging.WARNING, "ckptfs.access")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(r.run)
        for _ in range(40):
            r.note(4242, 7, "/proj-a", "lookup")
        r.note(4242, 8, "/proj-a", "open")
        r.note(4243, 9, "/proj-a", "lookup")
        await trio.sleep(5)
        assert noted.records == [] and r.pending() == 42  # the window is still open
        r.note(4242, 7, "/proj-a", "lookup")
        await trio.sleep(6)  # the windows end at 10 s
        assert counts(noted) == {(4242, "/proj-a", "lookup"): 41, (4242, "/proj-a", "open"): 1,
                                 (4243, "/proj-a", "lookup"): 1}
        assert len(noted.records) == 3 and r.pending() == 0
        first = next(x for x in noted.records if x.uid == 4242 and x.detail["op"] == "lookup")
        assert first.path == "/proj-a" and first.action == "access_refused" and first.pid == 7
        assert first.detail["pids"] == [7] and first.detail["window_s"] == 10
        # A refusal after the window's end opens a new one.
        r.note(4242, 7, "/proj-a", "lookup")
        await trio.sleep(11)
        assert len(noted.records) == 4 and noted.records[-1].detail["count"] == 1
        nursery.cancel_scope.cancel()
    lines = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    assert len(lines) == 4, lines
    assert any(ln.startswith("access refused: uid 4242, lookup in namespace /proj-a, 41 time(s)")
               for ln in lines), lines


async def test_close_writes_the_open_windows_and_memory_is_bounded(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "ckptfs.access")
    monkeypatch.setattr(refusals_mod, "OPEN_MAX", 3)
    noted = Noted()
    r = Refusals(noted, window_s=3600)  # type: ignore[arg-type]
    for op in ("a", "b", "c", "d"):  # the fourth closes the oldest window early
        r.note(1, 1, "/p", op)
    assert [x.detail["op"] for x in noted.records] == ["a"]
    assert r.close() == 3
    assert sorted(str(x.detail["op"]) for x in noted.records) == ["a", "b", "c", "d"]
    assert r.pending() == 0


async def test_every_refusal_of_the_namespace_rules_is_counted() -> None:
    cat, noted = FakeCatalog(), Noted()
    r = Refusals(noted, window_s=60)  # type: ignore[arg-type]
    access = Access(GOV, cat, trio.CapacityLimiter(1), groups_of=lambda pid: (),  # type: ignore[arg-type]
                    refusals=r)
    ctx = who(STRANGER)
    assert await errno_of(access.lookup(ctx, 2, b"run")) == errno.EACCES
    assert await errno_of(access.lookup(ctx, 2, b"run")) == errno.EACCES
    assert await errno_of(access.inode(ctx, 3, "open")) == errno.EACCES
    assert await errno_of(access.create(ctx, 1, b"proj-a", "mkdir")) == errno.EACCES
    assert await errno_of(access.remove(ctx, 1, b"proj-a", "rmdir")) == errno.EACCES
    assert await errno_of(access.inode(ctx, 2, "stat", root_visible=True)) == 0  # not refused
    r.close()
    assert counts(noted) == {(STRANGER, "/proj-a", "lookup"): 2, (STRANGER, "/proj-a", "open"): 1,
                             (STRANGER, "/proj-a", "mkdir"): 1, (STRANGER, "/proj-a", "rmdir"): 1}
