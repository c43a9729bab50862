"""The one definition of "durable on the remote" (catalog/durability.py), against a real
SQLite catalog: the chunks (no upload pending, a remote copy of each) and the names (a
catalog snapshot on the remote covering the commit) are both needed."""

from __future__ import annotations

import json
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckptfs.catalog import Catalog, ChunkRef, SqliteCatalog
from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.catalog.durability import checkpoint_durable, on_remote, snapshot_covers, uploaded

F = stat.S_IFREG | 0o644
D = stat.S_IFDIR | 0o755
REMOTES = ["s3"]
A, B = b"\x01" * 32, b"\x02" * 32


@pytest.fixture
def cat(tmp_path: Path) -> Iterator[Catalog]:
    c = SqliteCatalog(tmp_path / "c.sqlite")
    c.set_meta("tiers", json.dumps([{"name": "l", "kind": "local"}, {"name": "s3", "kind": "s3"}]))
    yield c
    c.close()


def _checkpoint(cat: Catalog, name: bytes, digests: list[bytes]) -> int:
    """A committed checkpoint /name holding one file of these chunks (uploads queued)."""
    d = cat.create(ROOT_INODE, name, D, 0, 0)
    f = cat.create(d.ino, b"model.pt", F, 0, 0)
    cat.commit_file(f.ino, 10 * len(digests), 1, 1, 16,
                    {i: ChunkRef(dg, 10, ("l",)) for i, dg in enumerate(digests)},
                    uploads={dg: REMOTES for dg in digests})
    commit_ns = time.time_ns()
    cat.checkpoint_commit("/" + name.decode(), "torch", 1, commit_ns, "test")
    return commit_ns


def _snapshot_now(cat: Catalog) -> None:
    cat.set_meta("snapshot_of_ns", str(time.time_ns()))


def test_a_checkpoint_is_durable_once_uploaded_and_covered_by_a_snapshot(cat: Catalog) -> None:
    commit_ns = _checkpoint(cat, b"step-1", [A, B])
    _snapshot_now(cat)
    assert not checkpoint_durable(cat, "/step-1", commit_ns, REMOTES)  # uploads pending
    assert cat.finish_upload(A, "s3") and cat.finish_upload(B, "s3")
    assert uploaded(cat, [A, B]) and on_remote(cat, [A, B], REMOTES)
    # The uploads changed the catalog after the snapshot: its names are not on the remote yet.
    cat.set_meta("snapshot_of_ns", str(commit_ns - 1))
    assert not snapshot_covers(cat, commit_ns)
    assert not checkpoint_durable(cat, "/step-1", commit_ns, REMOTES)
    _snapshot_now(cat)
    assert snapshot_covers(cat, commit_ns)
    assert checkpoint_durable(cat, "/step-1", commit_ns, REMOTES)


def test_a_checkpoint_whose_uploads_were_dropped_is_not_durable(cat: Catalog) -> None:
    """Retention drops the uploads of a superseded checkpoint: nothing is pending, and
    still nothing of it is on the remote."""
    commit_ns = _checkpoint(cat, b"step-1", [A])
    assert cat.drop_upload_jobs([A]) == 1
    _snapshot_now(cat)
    assert uploaded(cat, [A]) and not on_remote(cat, [A], REMOTES)
    assert not checkpoint_durable(cat, "/step-1", commit_ns, REMOTES)
    assert not on_remote(cat, [A], ["another-bucket"])


def test_a_checkpoint_without_chunks_is_not_durable(cat: Catalog) -> None:
    cat.create(ROOT_INODE, b"empty", D, 0, 0)
    commit_ns = time.time_ns()
    cat.checkpoint_commit("/empty", "torch", 1, commit_ns, "test")
    _snapshot_now(cat)
    assert not checkpoint_durable(cat, "/empty", commit_ns, REMOTES)


def test_snapshot_covers_a_moment_it_was_taken_after_or_an_unchanged_catalog(cat: Catalog) -> None:
    assert cat.snapshot_of_ns() is None
    t = time.time_ns()
    cat.create(ROOT_INODE, b"f", F, 0, 0)  # a namespace change: the catalog is newer than any snapshot
    assert not snapshot_covers(cat, t)
    cat.set_meta("snapshot_of_ns", str(t - 1))
    assert not snapshot_covers(cat, t)
    _snapshot_now(cat)  # taken after the last change: current, so it covers any earlier moment
    assert snapshot_covers(cat, t) and snapshot_covers(cat, 0)
