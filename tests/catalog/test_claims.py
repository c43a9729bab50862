"""Owners of deletion claims (catalog/claims.py) on both engines: a restarted daemon takes
back the claims its node's dead daemon left, never another node's or a live session's,
and the schema-8 migration brings the table to an older catalog."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.catalog_conformance import lease_end
from tests.support.catalogs import Cat, downgrade_postgres, downgrade_sqlite

from ckptfs.catalog import ChunkRef, PostgresCatalog, SqliteCatalog
from ckptfs.catalog.catalog import ROOT_INODE, SCHEMA_VERSION

A, B, C, D, E = (bytes([i]) * 32 for i in range(1, 6))


def claim_values(c: Cat) -> dict[bytes, int]:
    """Each claimed row's lease value."""
    rows = c._query("SELECT digest, next_try_ns FROM deletions WHERE next_try_ns < 0")
    return {bytes(d): -int(v) for d, v in rows}


def test_a_restart_takes_back_only_its_node_s_dead_claims(cat: Cat) -> None:
    live = cat.register_session("n1-twin", 60).sid  # a live session (another daemon)
    cat.queue_deletions([(d, "s3") for d in (A, B, C, D, E)])
    dead, other, unowned = lease_end(), lease_end() + 1, lease_end() + 2
    assert cat.claim_deletions([(A, "s3")], dead, ("n1", "dead-sid")) == [(A, "s3")]
    assert cat.claim_deletions([(B, "s3")], other, ("n2", "its-sid")) == [(B, "s3")]
    assert cat.claim_deletions([(C, "s3")], other, ("n1", live)) == [(C, "s3")]
    assert cat.claim_deletions([(D, "s3")], unowned) == [(D, "s3")]  # an older ckptfs
    # E's claim ended: its owner row is stale, and no claim any more.
    assert cat.claim_deletions([(E, "s3")], dead, ("n1", "dead-sid")) == [(E, "s3")]
    cat.release_deletion_claims([(E, "s3")], dead)
    until = time.time_ns() + 5 * 10**9
    taken = cat.adopt_deletion_claims("n1", "new-sid", {"s3": until})
    assert taken == [(A, "s3", until)]
    assert claim_values(cat) == {A: until, B: other, C: other, D: unowned}
    # Taken back: the claim is the new daemon's now (its end releases it, as a deleter's).
    assert cat.adopt_deletion_claims("n1", "newer-sid", {"other-tier": until}) == []
    assert cat.release_deletion_claims([(A, "s3")], until) == 1
    assert cat.due_deletions(time.time_ns(), 10, set(), ["s3"])[0].digest in (A, E)


def test_a_one_daemon_catalog_takes_back_every_claim(cat: Cat) -> None:
    cat.queue_deletions([(A, "s3"), (B, "s3"), (C, "local0")])
    assert cat.claim_deletions([(A, "s3")], lease_end(), ("", "old-run")) == [(A, "s3")]
    assert cat.claim_deletions([(B, "s3")], lease_end()) == [(B, "s3")]
    until = time.time_ns()
    taken = cat.adopt_deletion_claims("", "new-run", {"s3": until}, every=True)
    assert sorted(taken) == [(A, "s3", until), (B, "s3", until)]
    assert claim_values(cat) == {A: until, B: until}


def test_a_claim_kept_after_a_delete_in_doubt_keeps_its_owner(cat: Cat) -> None:
    cat.queue_deletions([(A, "s3")])
    first = lease_end()
    assert cat.claim_deletions([(A, "s3")], first, ("n1", "dead-sid")) == [(A, "s3")]
    kept = time.time_ns() + 60 * 10**9
    cat.postpone_deletion(A, "s3", kept, "read timeout", first, keep_claim=True)
    until = time.time_ns()
    assert cat.adopt_deletion_claims("n1", "new-sid", {"s3": until}) == [(A, "s3", until)]


def test_the_upload_a_dead_claim_held_goes_once_the_claim_taken_back_ends(cat: Cat) -> None:
    """The same bytes written again while a dead daemon's DELETE of the object was claimed:
    the upload waits for the claim (the DELETE may land after the PUT). Taken back at the
    start and released when the tier's grace ends, the upload is due then, not after the
    dead claim's 600 s lease."""
    cat.queue_deletions([(A, "s3")])
    assert cat.claim_deletions([(A, "s3")], lease_end(), ("n1", "dead")) == [(A, "s3")]
    f = cat.create(ROOT_INODE, b"f", 0o100644, 0, 0)
    cat.commit_file(f.ino, 10, 1, 1, 10, {0: ChunkRef(A, 10, ("l",))}, uploads={A: ["s3"]})
    assert cat.due_uploads(time.time_ns(), 10, set()) == []  # held by the claim
    until = time.time_ns()
    assert cat.adopt_deletion_claims("n1", "new", {"s3": until}) == [(A, "s3", until)]
    assert cat.due_uploads(time.time_ns(), 10, set()) == []  # still held: the grace
    assert cat.release_deletion_claims([(A, "s3")], until) == 1  # the grace ended
    assert [(j.digest, j.tier) for j in cat.due_uploads(time.time_ns(), 10, set())] == [
        (A, "s3")]


def _claims_work(c: Cat) -> None:
    assert c.get_meta("schema_version") == str(SCHEMA_VERSION) == "11"
    c.queue_deletions([(A, "s3")])
    assert c.claim_deletions([(A, "s3")], lease_end(), ("n1", "dead")) == [(A, "s3")]
    assert [t for _d, t, _u in c.adopt_deletion_claims("n1", "new", {"s3": 1})] == ["s3"]


def test_a_version_7_sqlite_catalog_gets_the_claims_table(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    downgrade_sqlite(path, 7, "DROP TABLE deletion_claims")
    c = SqliteCatalog(path)
    try:
        _claims_work(c)
    finally:
        c.close()


def test_a_version_7_postgres_catalog_gets_the_claims_table(pg_url: str) -> None:
    downgrade_postgres(pg_url, 7, "DROP TABLE deletion_claims")
    with pytest.raises(Exception, match="migration"):
        PostgresCatalog(pg_url, pool_size=1, readonly=True)
    c = PostgresCatalog(pg_url, pool_size=1)
    try:
        _claims_work(c)
    finally:
        c.close()
