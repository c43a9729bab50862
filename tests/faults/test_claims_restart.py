"""Deletion claims a killed daemon left (catalog/claims.py, upload/deleter.py): the
restarted daemon of the same node takes them back at its start, instead of letting the
rows (and the uploads of their pairs) wait out the dead claims' 600 s lease.

In process: a deleter stopped with its remote DELETE hung leaves the claim (as a kill
does); a new deleter on the same catalog takes it back and deletes the row. Through a real
mount: SeaweedFS SIGSTOPped while the daemon deletes, the daemon killed with -9, the
mount started again: its claims are the new daemon's at once, ending within the bucket's
request grace."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest
import trio
import trio.testing

from tests.faults.test_loop_rules import held_remote_deletion
from tests.support.freeze import freeze
from tests.support.mountutil import FUSE_AVAILABLE, mounted, run_cli, wait_until
from tests.support.s3server import OUTAGE_WARNINGS, SeaweedServer

from ckptfs.catalog import SqliteCatalog
from ckptfs.catalog.sql import CLAIM_LEASE_NS
from ckptfs.chunks.guard import ChunkGuard
from ckptfs.chunks.room import Room
from ckptfs.chunks.store import stats_for
from ckptfs.upload.deleter import Deleter

KiB = 1024
CS = 256 * KiB


async def test_a_restarted_deleter_takes_back_the_claim_its_dead_predecessor_left(
    tmp_path: Path,
) -> None:
    cat, inner, remote, gate, deleter, digest = held_remote_deletion(tmp_path)
    try:
        async with trio.open_nursery() as n:
            n.start_soon(deleter.run)
            deleter.kick()
            await trio.to_thread.run_sync(remote.delete_held.wait, 30)
            n.cancel_scope.cancel()  # the stop abandons the hung DELETE: its claim stays
        lease = cat.next_deletion_due_ns(set(), ["r"])
        assert lease is not None and lease > time.time_ns() + 60 * 10**9  # the dead one's
        gate.set()  # the tier answers again
        tiers = list(deleter.tiers.values())
        again = Deleter(cat, tiers, trio.CapacityLimiter(1), guard=ChunkGuard(["l"]),
                        stats=stats_for(tiers), room=Room())
        # Real time: a mock clock's autojump would also jump while the catalog's worker
        # threads run, and end this at random. Waiting out the dead lease (600 s) would
        # end here as TooSlowError; taken back, the row goes within the tier's grace (0 s).
        with trio.fail_after(CLAIM_LEASE_NS / 1e9 / 10):
            async with trio.open_nursery() as n:
                n.start_soon(again.run)
                again.kick()
                while again.deleted < 1:
                    await again._progress.wait()  # set after each row: no poll of ours
                n.cancel_scope.cancel()
        assert again.adopted == [(digest, "r")]  # taken back at its start
        assert cat.deletion_keys("r") == set() and not inner.frames
    finally:
        gate.set()
        cat.close()


def claims(state_dir: Path) -> dict[bytes, int]:
    """The claimed deletion rows of the mount's catalog: digest -> the lease value."""
    cat = SqliteCatalog(state_dir / "catalog.sqlite", readonly=True)
    try:
        rows = cat._query("SELECT digest, next_try_ns FROM deletions WHERE next_try_ns < 0")
        return {bytes(d): -int(v) for d, v in rows}
    finally:
        cat.close()


@pytest.mark.slow
@pytest.mark.skipif(not FUSE_AVAILABLE, reason="FUSE is not available here")
@pytest.mark.allow_log_warnings("cleaning up stale mount", *OUTAGE_WARNINGS)
def test_a_remount_takes_back_the_claims_of_its_killed_daemon(
    tmp_path: Path, own_seaweed: SeaweedServer
) -> None:
    prefix = f"c-{uuid.uuid4().hex[:10]}"
    url = f"s3://{own_seaweed.bucket}/{prefix}?endpoint={own_seaweed.endpoint}"
    with mounted(tmp_path, 2, ("--chunk-size", "256KiB", "--remote", url)) as m:
        (m.mountpoint / "big.bin").write_bytes(os.urandom(4 * CS))
        assert run_cli("sync", str(m.mountpoint), "--timeout", "60").returncode == 0
        assert own_seaweed.proc is not None
        freeze(own_seaweed.proc.pid)  # the DELETEs hang, claimed
        try:
            os.unlink(m.mountpoint / "big.bin")
            left = wait_until(lambda: claims(m.state_dir), 30, "remote deletions claimed")
            m.kill9()
        finally:
            os.kill(own_seaweed.proc.pid, signal.SIGCONT)
        assert claims(m.state_dir) == left  # the dead daemon's, for its whole lease
        m.start()
        # Taken back at the start, not when their lease ends: each is the new daemon's,
        # until the bucket's request grace (its DELETE, in doubt, may land until then).
        wait_until(lambda: all(claims(m.state_dir).get(d) != v for d, v in left.items()), 30,
                   "the killed daemon's claims taken back")
        now = claims(m.state_dir)
        assert all(now.get(d, 0) < v for d, v in left.items()), (left, now)
        log = (m.state_dir / "ckptfs.log").read_text()
        assert "deletion claim(s) a dead daemon of this node left" in log
