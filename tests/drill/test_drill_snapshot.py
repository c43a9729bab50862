"""A drill of a single-node (SQLite) mount reads what a new node would restore: the
bucket's catalog snapshot (ckptfs/drill/snapshot.py, docs/operations.md "Restore drills"),
on real mounts with the real SeaweedFS. A snapshot deleted or damaged in the bucket fails
the drill, naming it, while the mount reads fine; a snapshot older than the live catalog
is drilled and the newer checkpoint reported as not in it; a snapshot without a committed
checkpoint of the run fails the drill. With a shared (PostgreSQL) catalog the drill reads that
catalog, as a new node would, and needs no snapshot."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.drill.test_drill import FAILED, _args, _config, _saved, _st, drill
from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON, Mount, mounted, wait_until
from tests.support.s3server import SeaweedServer

from ckptfs.catalog import PostgresCatalog, SqliteCatalog

pytestmark = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)


def _key(prefix: str) -> str:
    return f"{prefix}/meta/catalog.snapshot"  # the S3 tier's metadata object (uploader)


def _settled(m: Mount) -> None:
    """Wait until the bucket's snapshot holds the catalog as it is: the uploader has no
    change left to snapshot, so it will not overwrite what the test puts there."""
    def current() -> bool:
        cat = SqliteCatalog(m.state_dir / "catalog.sqlite", readonly=True)
        try:
            return cat.snapshot_is_current()
        finally:
            cat.close()
    wait_until(current, what="the catalog snapshot is current")


@pytest.mark.allow_log_warnings(FAILED)
def test_a_damaged_or_missing_bucket_snapshot_fails_the_drill_while_the_mount_reads(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str],
) -> None:
    url, prefix = remote
    payload = os.urandom(300_000)
    with mounted(tmp_path / "node", 1, _args(url, _config(tmp_path))) as m:
        run = m.mountpoint / "run"
        root = _saved(m, run, 1, payload)
        rc, [report], err = drill(str(run))
        assert rc == 0, err
        assert report["checkpoint"] == root and report["source"].startswith("catalog snapshot")
        assert report["not_in_snapshot"] == ""
        _settled(m)
        key = _key(prefix)
        good = seaweed.get_object(key)
        assert good is not None
        # One byte of the bucket's snapshot flipped: it no longer verifies.
        body = bytearray(good)
        body[len(body) // 2] ^= 0x01
        seaweed.put_object(key, bytes(body))
        rc, [report], err = drill(str(run))
        assert rc == 1 and report["result"] == "failed"
        first = report["problems"][0]
        assert "catalog snapshot" in first and "does not verify" in first
        assert "FAILED" in err and "catalog snapshot" in err
        # The mount reads its checkpoint fine: only a drill, reading as a new node, saw it.
        assert (run / "checkpoint-1" / "model.safetensors").read_bytes() == _st(payload)
        # No snapshot in the bucket at all.
        seaweed.put_object(key, None)
        rc, [report], err = drill(str(run))
        assert rc == 1 and report["bytes"] == 0
        assert report["problems"][0].startswith("no catalog snapshot in the bucket")
        assert (run / "checkpoint-1" / "model.safetensors").read_bytes() == _st(payload)
        # The snapshot put back: the drill passes again.
        seaweed.put_object(key, good)
        rc, [report], err = drill(str(run))
        assert rc == 0 and report["checkpoint"] == root, err


@pytest.mark.allow_log_warnings(FAILED)
def test_a_drill_reads_the_snapshots_checkpoint_not_the_live_catalogs(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str],
) -> None:
    url, prefix = remote
    key = _key(prefix)
    with mounted(tmp_path / "node", 1, _args(url, _config(tmp_path))) as m:
        run = m.mountpoint / "run"
        run.mkdir()
        (run / "notes.txt").write_bytes(b"not a checkpoint")
        _settled(m)
        empty = seaweed.get_object(key)  # a snapshot holding the run, no checkpoint of it
        first = _saved(m, run, 1, os.urandom(300_000))
        _settled(m)
        older = seaweed.get_object(key)  # holding checkpoint-1
        second = _saved(m, run, 2, os.urandom(300_000))
        _settled(m)
        rc, [report], err = drill(str(run))
        assert rc == 0 and report["checkpoint"] == second and report["not_in_snapshot"] == ""
        # The bucket's snapshot is behind the live catalog (checkpoint-2 committed just
        # now): the snapshot's checkpoint is drilled, the live one reported, no failure.
        seaweed.put_object(key, older)
        rc, [report], err = drill(str(run))
        assert rc == 0, err
        assert report["checkpoint"] == first and report["not_in_snapshot"] == second
        assert f"{second} (committed" in m.log and "not yet in the bucket's catalog" in m.log
        # A snapshot without a committed checkpoint of the run: nothing a new node could
        # restore, although the live catalog has two.
        seaweed.put_object(key, empty)
        rc, [report], err = drill(str(run))
        assert rc == 1 and report["checkpoint"] == ""
        assert report["problems"][0].startswith(
            "/run: no committed checkpoint in the bucket's catalog snapshot")
        assert second in report["problems"][0]


@pytest.mark.usefixtures("postgres")
def test_with_a_shared_catalog_the_drill_reads_that_catalog_not_a_snapshot(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str], pg_url: str,
) -> None:
    """A new node of a PostgreSQL mount reads the shared catalog itself: the drill too,
    so a bucket without a catalog snapshot does not fail it."""
    url, prefix = remote
    args = ("--catalog", pg_url, "--node", "a", *_args(url, _config(tmp_path)))
    with mounted(tmp_path / "node", 1, args) as m:
        run = m.mountpoint / "run"
        root = _saved(m, run, 1, os.urandom(300_000))

        def current() -> bool:
            cat = PostgresCatalog(pg_url, pool_size=1, readonly=True)
            try:
                return cat.snapshot_is_current()
            finally:
                cat.close()
        wait_until(current, what="the catalog snapshot is current")  # none retaken below
        seaweed.put_object(_key(prefix), None)
        rc, [report], err = drill(str(run))
        assert rc == 0, err
        assert report["checkpoint"] == root and report["source"] == "live catalog"
        assert report["bytes"] == report["total_bytes"] > 0
