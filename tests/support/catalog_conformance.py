"""The catalog conformance suite, written against the catalog Protocols (ckptfs/catalog/
protocols.py) so that it runs on every engine.

A test module subclasses ``CatalogConformance`` as ``Test...`` and provides a ``catalog``
fixture that yields an empty catalog of its engine (test_catalog_conformance.py: SQLite).
Nothing here speaks SQL or knows the engine: only the Protocol's methods and rows.
"""

from __future__ import annotations

import errno
import json
import stat
import time
from collections.abc import Callable
from typing import Any

import pytest

from ckptfs.catalog.protocols import Catalog
from ckptfs.catalog.rows import (
    ROOT_INODE,
    Around,
    CheckpointRow,
    CheckpointState,
    ChunkRef,
    Registered,
    SessionEnd,
)
from ckptfs.catalog.sql import CLAIM_LEASE_NS
from ckptfs.errors import CkptfsError, UsageError

R = ROOT_INODE


def lease_end() -> int:
    """A claim's lease value, as a deleter makes it (the wall clock plus the lease)."""
    return time.time_ns() + CLAIM_LEASE_NS
F = stat.S_IFREG | 0o644
D = stat.S_IFDIR | 0o755
A, B, C = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32


def errno_of(fn: Callable[..., Any], *args: Any) -> int:
    with pytest.raises(CkptfsError) as info:
        fn(*args)
    return info.value.errno


def one_chunk_file(cat: Catalog, name: bytes, digest: bytes, tiers: tuple[str, ...] = ("l",),
                   uploads: dict[bytes, list[str]] | None = None, mtime_ns: int = 1) -> int:
    """A file in the root naming one 10-byte chunk; its inode number."""
    f = cat.create(R, name, F, 0, 0)
    cat.commit_file(f.ino, 10, mtime_ns, mtime_ns, 16, {0: ChunkRef(digest, 10, tiers)},
                    uploads=uploads)
    return f.ino


class CatalogConformance:
    # -- namespace ---------------------------------------------------------------------------

    def test_a_new_catalog_has_a_root_directory(self, catalog: Catalog) -> None:
        root = catalog.get_inode(R)
        assert root.is_dir and root.nlink == 2
        assert catalog.readdir(R, 0) == []
        assert catalog.resolve("/") == root

    def test_create_lookup_and_exact_errors(self, catalog: Catalog) -> None:
        f = catalog.create(R, b"a", F, 0, 0)
        assert catalog.lookup(R, b"a").ino == f.ino
        assert errno_of(catalog.lookup, R, b"missing") == errno.ENOENT
        assert errno_of(catalog.create, R, b"a", F, 0, 0) == errno.EEXIST
        assert errno_of(catalog.create, R, b"a", D, 0, 0) == errno.EEXIST
        assert errno_of(catalog.lookup, f.ino, b"x") == errno.ENOTDIR
        assert errno_of(catalog.create, f.ino, b"x", F, 0, 0) == errno.ENOTDIR
        assert errno_of(catalog.unlink, R, b"missing") == errno.ENOENT
        assert errno_of(catalog.get_inode, 10_000) == errno.ENOENT

    def test_inode_numbers_are_never_reused(self, catalog: Catalog) -> None:
        f = catalog.create(R, b"f", F, 0, 0)
        catalog.unlink(R, b"f")
        catalog.delete_inode(f.ino)
        assert catalog.create(R, b"f", F, 0, 0).ino > f.ino

    def test_symlinks_special_files_and_setgid_directories(self, catalog: Catalog) -> None:
        ln = catalog.create(R, b"ln", stat.S_IFLNK | 0o777, 0, 0, b"target")
        assert catalog.get_inode(ln.ino).target == b"target" and ln.size == 6
        dev = catalog.create(R, b"dev", stat.S_IFCHR | 0o600, 0, 0, None, 0x0103)
        assert catalog.get_inode(dev.ino).rdev == 0x0103
        g = catalog.create(R, b"g", D | stat.S_ISGID, 0, 42)
        sub = catalog.create(g.ino, b"sub", D, 7, 7)
        f = catalog.create(g.ino, b"f", F, 7, 7)
        assert (sub.gid, f.gid) == (42, 42)
        assert sub.mode & stat.S_ISGID and not f.mode & stat.S_ISGID

    def test_directory_link_counts(self, catalog: Catalog) -> None:
        d = catalog.create(R, b"d", D, 0, 0)
        catalog.create(d.ino, b"e", D, 0, 0)
        assert catalog.get_inode(R).nlink == 3
        assert catalog.get_inode(d.ino).nlink == 3
        assert errno_of(catalog.rmdir, R, b"d") == errno.ENOTEMPTY
        assert errno_of(catalog.unlink, R, b"d") == errno.EISDIR
        catalog.rename(d.ino, b"e", R, b"e", False)
        assert catalog.get_inode(d.ino).nlink == 2
        assert catalog.get_inode(R).nlink == 4
        assert catalog.rmdir(R, b"e").nlink == 0
        assert catalog.get_inode(R).nlink == 3
        catalog.create(R, b"f", F, 0, 0)
        assert errno_of(catalog.rmdir, R, b"f") == errno.ENOTDIR

    def test_link_and_unlink(self, catalog: Catalog) -> None:
        d = catalog.create(R, b"d", D, 0, 0)
        f = catalog.create(R, b"f", F, 0, 0)
        linked = catalog.link(f.ino, d.ino, b"g")
        assert linked.ino == f.ino and linked.nlink == 2
        assert catalog.lookup(d.ino, b"g").ino == f.ino
        assert errno_of(catalog.link, f.ino, d.ino, b"g") == errno.EEXIST
        assert errno_of(catalog.link, d.ino, R, b"d2") == errno.EPERM  # no links to directories
        assert catalog.unlink(R, b"f").nlink == 1
        assert catalog.get_inode(f.ino).nlink == 1
        assert catalog.unlink(d.ino, b"g").nlink == 0
        assert catalog.unlinked_inodes() == [f.ino]  # no name left, the inode remains
        catalog.delete_inode(f.ino)
        assert catalog.unlinked_inodes() == []
        assert errno_of(catalog.get_inode, f.ino) == errno.ENOENT

    def test_rename_rules(self, catalog: Catalog) -> None:
        a = catalog.create(R, b"a", F, 0, 0)
        b = catalog.create(R, b"b", F, 0, 0)
        replaced = catalog.rename(R, b"a", R, b"b", False)  # over an existing name
        assert replaced is not None and replaced.ino == b.ino and replaced.nlink == 0
        assert catalog.lookup(R, b"b").ino == a.ino
        assert errno_of(catalog.lookup, R, b"a") == errno.ENOENT
        c = catalog.create(R, b"c", F, 0, 0)
        assert errno_of(catalog.rename, R, b"c", R, b"b", True) == errno.EEXIST  # RENAME_NOREPLACE
        assert errno_of(catalog.rename, R, b"missing", R, b"x", False) == errno.ENOENT
        d = catalog.create(R, b"d", D, 0, 0)
        sub = catalog.create(d.ino, b"sub", D, 0, 0)
        assert errno_of(catalog.rename, R, b"d", sub.ino, b"x", False) == errno.EINVAL
        assert errno_of(catalog.rename, R, b"d", d.ino, b"x", False) == errno.EINVAL
        assert errno_of(catalog.rename, R, b"c", R, b"d", False) == errno.EISDIR
        assert errno_of(catalog.rename, R, b"d", R, b"c", False) == errno.ENOTDIR
        catalog.create(sub.ino, b"f", F, 0, 0)
        e = catalog.create(R, b"e", D, 0, 0)
        catalog.rename(R, b"d", R, b"e", False)  # onto an empty directory: allowed
        assert catalog.lookup(R, b"e").ino == d.ino
        assert catalog.get_inode(e.ino).nlink == 0
        assert catalog.lookup(catalog.lookup(catalog.lookup(R, b"e").ino, b"sub").ino, b"f").ino
        assert c.ino != d.ino

    def test_path_of_the_root_nested_entries_links_and_unlinked_inodes(self, catalog: Catalog) -> None:
        a = catalog.create(R, b"a", D, 0, 0)
        b = catalog.create(a.ino, b"b", D, 0, 0)
        f = catalog.create(b.ino, b"f\xff", F, 0, 0)
        assert catalog.path_of(R) == "/"
        assert catalog.path_of(a.ino) == "/a"
        assert catalog.path_of(f.ino) == "/a/b/f\udcff"  # not UTF-8: surrogate escapes
        catalog.link(f.ino, R, b"g")
        assert catalog.path_of(f.ino) in {"/a/b/f\udcff", "/g"}  # either of its names
        catalog.unlink(b.ino, b"f\xff")
        assert catalog.path_of(f.ino) == "/g"
        catalog.unlink(R, b"g")
        assert catalog.path_of(f.ino) == "<unlinked>/"  # open, with no name left

    def test_a_change_tells_its_directories_as_the_catalog_has_them_after_it(
            self, catalog: Catalog) -> None:
        """``Around``: what the VFS caches instead of asking again (the directories' new
        attributes, their paths, the moved inode) equals what the catalog then answers."""
        a = catalog.create(R, b"a", D, 0, 0)
        b = catalog.create(a.ino, b"b", D, 0, 0)

        def told(around: Around, dirs: set[int]) -> None:
            assert set(around.dirs) == dirs
            for ino, attrs in around.dirs.items():
                assert attrs == catalog.get_inode(ino), ino
            assert around.dir_paths == {d: catalog.path_of(d) for d in around.dir_paths}

        around = Around(paths=True)
        f = catalog.create(b.ino, b"f", F, 0, 0, around=around)
        told(around, {b.ino})
        assert around.dir_paths == {b.ino: "/a/b"}
        around = Around(paths=True)
        sub = catalog.create(b.ino, b"sub", D, 0, 0, around=around)  # a directory: nlink + 1
        told(around, {b.ino})
        around = Around()
        catalog.create(R, b"g", F, 0, 0, around=around)
        told(around, {R})
        assert around.dir_paths == {}  # not asked for
        around = Around(paths=True)
        assert catalog.rename(b.ino, b"f", a.ino, b"f2", False, around=around) is None
        told(around, {a.ino, b.ino})
        assert around.dir_paths == {a.ino: "/a", b.ino: "/a/b"}
        assert around.moved == catalog.get_inode(f.ino)
        around = Around(paths=True)
        replaced = catalog.rename(R, b"g", a.ino, b"f2", False, around=around)  # replaces f2
        assert replaced is not None and replaced.ino == f.ino
        told(around, {R, a.ino})
        around = Around(paths=True)
        catalog.rename(b.ino, b"sub", R, b"sub", False, around=around)  # a directory moved
        assert around.dirs == {} and around.moved == catalog.get_inode(sub.ino)
        assert around.dir_paths == {b.ino: "/a/b", R: "/"}
        h = catalog.create(R, b"h", F, 0, 0)
        catalog.link(h.ino, R, b"h2")
        around = Around(paths=True)
        assert catalog.rename(R, b"h", R, b"h2", False, around=around) is None  # the no-op
        told(around, {R})
        assert around.moved == catalog.get_inode(h.ino)
        around = Around(paths=True)
        gone = catalog.unlink(a.ino, b"f2", around=around)
        told(around, {a.ino})
        assert around.dir_paths == {a.ino: "/a"} and gone.nlink == 0

    def test_path_of_a_deep_tree_is_one_statement_s_answer(self, catalog: Catalog) -> None:
        parent, names = R, []
        for i in range(40):
            names.append(f"d{i}")
            parent = catalog.create(parent, names[-1].encode(), D, 0, 0).ino
        leaf = catalog.create(parent, b"leaf", F, 0, 0)
        assert catalog.path_of(leaf.ino) == "/" + "/".join([*names, "leaf"])
        assert catalog.path_of(parent) == "/" + "/".join(names)

    def test_rename_of_a_non_empty_directory_moves_its_subtree(self, catalog: Catalog) -> None:
        src = catalog.create(R, b"tmp-ckpt", D, 0, 0)
        shard = catalog.create(src.ino, b"shard-0", F, 0, 0)
        catalog.create(src.ino, b"inner", D, 0, 0)
        runs = catalog.create(R, b"runs", D, 0, 0)
        full = catalog.create(R, b"full", D, 0, 0)
        catalog.create(full.ino, b"x", F, 0, 0)
        assert errno_of(catalog.rename, R, b"tmp-ckpt", R, b"full", False) == errno.ENOTEMPTY
        assert catalog.rename(R, b"tmp-ckpt", runs.ino, b"step-1", False) is None  # Orbax's commit
        assert catalog.resolve("/runs/step-1/shard-0") == catalog.get_inode(shard.ino)
        assert catalog.resolve("/tmp-ckpt") is None
        assert catalog.path_of(shard.ino) == "/runs/step-1/shard-0"
        assert catalog.get_inode(runs.ino).nlink == 3 and catalog.get_inode(R).nlink == 4
        assert [i.ino for i in catalog.files_under("/runs")] == [shard.ino]

    def test_rename_between_two_links_of_one_inode_does_nothing(self, catalog: Catalog) -> None:
        f = catalog.create(R, b"f", F, 0, 0)
        catalog.link(f.ino, R, b"g")
        assert catalog.rename(R, b"f", R, b"g", False) is None
        assert {n for _, n, _ in catalog.readdir(R, 0)} == {b"f", b"g"}
        assert catalog.get_inode(f.ino).nlink == 2

    def test_readdir_is_stable_across_renames(self, catalog: Catalog) -> None:
        for i in range(10):
            catalog.create(R, f"f{i}".encode(), F, 0, 0)
        first = catalog.readdir(R, 0, limit=4)
        rest = catalog.readdir(R, first[-1][0], limit=100)
        names = [n for _, n, _ in first + rest]
        assert names == [f"f{i}".encode() for i in range(10)]
        assert catalog.list_names(R) == [n.decode() for n in names]
        catalog.rename(R, b"f0", R, b"g0", False)
        assert [n for _, n, _ in catalog.readdir(R, 0)][0] == b"g0"

    def test_setattr(self, catalog: Catalog) -> None:
        f = catalog.create(R, b"f", F, 0, 0)
        new = catalog.setattr(f.ino, mode=0o600, uid=5, atime_ns=11, mtime_ns=12)
        assert (new.mode, new.uid, new.gid, new.atime_ns, new.mtime_ns) == (stat.S_IFREG | 0o600, 5, 0, 11, 12)
        assert catalog.get_inode(f.ino) == new
        assert new.ctime_ns >= f.ctime_ns

    def test_xattrs(self, catalog: Catalog) -> None:
        f = catalog.create(R, b"f", F, 0, 0)
        t0 = catalog.get_inode(f.ino).ctime_ns
        assert catalog.set_xattr(f.ino, b"user.b", b"2").ctime_ns >= t0
        catalog.set_xattr(f.ino, b"user.a", b"1")
        assert catalog.list_xattrs(f.ino) == [b"user.a", b"user.b"]
        assert catalog.get_xattr(f.ino, b"user.a") == b"1"
        assert catalog.get_xattr(f.ino, b"user.c") is None
        assert errno_of(lambda: catalog.set_xattr(f.ino, b"user.a", b"x", create=True)) == errno.EEXIST
        assert errno_of(lambda: catalog.set_xattr(f.ino, b"user.c", b"x", replace_only=True)) == errno.ENODATA
        assert catalog.xattr_inodes() == {f.ino}
        catalog.remove_xattr(f.ino, b"user.a")
        assert errno_of(catalog.remove_xattr, f.ino, b"user.a") == errno.ENODATA
        catalog.unlink(R, b"f")
        catalog.delete_inode(f.ino)
        assert catalog.xattr_inodes() == set()

    def test_xattrs_total_max(self, catalog: Catalog) -> None:
        f = catalog.create(R, b"f", F, 0, 0)
        catalog.set_xattr(f.ino, b"user.a", b"x" * 90, total_max=100)  # 6 + 90 bytes
        assert errno_of(lambda: catalog.set_xattr(f.ino, b"user.b", b"", total_max=100)) == errno.ENOSPC
        assert catalog.list_xattrs(f.ino) == [b"user.a"]  # nothing stored
        # Replacing a value counts the new one only.
        catalog.set_xattr(f.ino, b"user.a", b"y" * 94, total_max=100)
        assert errno_of(lambda: catalog.set_xattr(f.ino, b"user.a", b"y" * 95, total_max=100)) == errno.ENOSPC
        assert catalog.get_xattr(f.ino, b"user.a") == b"y" * 94
        catalog.remove_xattr(f.ino, b"user.a")
        catalog.set_xattr(f.ino, b"user.b", b"z" * 94, total_max=100)

    # -- file contents -----------------------------------------------------------------------

    def test_commit_file_and_unreferenced_chunks(self, catalog: Catalog) -> None:
        f = catalog.create(R, b"f", F, 0, 0)
        r0 = ChunkRef(A, 10, ("t0",))
        r1 = ChunkRef(B, 10, ("t1",))
        catalog.commit_file(f.ino, 20, 1, 1, 10, {0: r0, 1: r1})
        assert catalog.extents(f.ino) == {0: r0, 1: r1}
        assert catalog.get_inode(f.ino).size == 20
        assert catalog.has_chunk(A) and catalog.chunk_length(A) == 10
        assert catalog.referenced_digests() == {A, B}
        dropped = catalog.commit_file(f.ino, 5, 2, 2, 10, {})  # truncate: chunk 1 falls off
        assert dropped == [r1.digest]
        assert set(catalog.extents(f.ino)) == {0}
        assert catalog.drop_unreferenced([r0.digest, r1.digest]) == {r1.digest: ["t1"]}
        assert not catalog.has_chunk(B) and catalog.chunk_length(B) == 0
        inode = catalog.unlink(R, b"f")
        assert inode.nlink == 0
        assert catalog.delete_inode(f.ino) == [r0.digest]
        assert catalog.drop_unreferenced([r0.digest]) == {r0.digest: ["t0"]}
        assert errno_of(catalog.get_inode, f.ino) == errno.ENOENT

    def test_a_commit_of_many_chunks_drops_exactly_what_it_replaces(self, catalog: Catalog) -> None:
        """More extents than one statement takes (sql.py _IN_BATCH): every replaced and
        every truncated digest comes back once, and the extents are the new version's."""
        f = catalog.create(R, b"big", F, 0, 0)
        n = 1234
        old = {i: ChunkRef(i.to_bytes(32, "big"), 10, ("l",)) for i in range(n)}
        assert catalog.commit_file(f.ino, 10 * n, 1, 1, 10, dict(old)) == []
        # Rewrite every third chunk, punch chunk 5, and truncate the last 100.
        new = {i: ChunkRef((i + 10_000).to_bytes(32, "big"), 10, ("l",))
               for i in range(0, n - 100, 3)}
        changes: dict[int, ChunkRef | None] = {**new, 5: None}
        dropped = catalog.commit_file(f.ino, 10 * (n - 100), 2, 2, 10, changes)
        want = [old[i].digest for i in (*new, 5, *range(n - 100, n))]
        assert sorted(dropped) == sorted(want)
        ext = catalog.extents(f.ino)
        assert set(ext) == set(range(n - 100)) - {5}
        assert all(ext[i].digest == (new[i] if i in new else old[i]).digest for i in ext)

    def test_a_file_whose_last_name_went_takes_no_new_one(self, catalog: Catalog) -> None:
        """As Linux (ENOENT): another node's kernel may still think the file has a name and
        link it by its number while this node drops it; the drop then takes its extents."""
        f = one_chunk_file(catalog, b"f", A)
        catalog.link(f, R, b"g")
        assert catalog.unlink(R, b"f").nlink == 1 and catalog.unlink(R, b"g").nlink == 0
        assert errno_of(catalog.link, f, R, b"again") == errno.ENOENT
        assert errno_of(catalog.lookup, R, b"again") == errno.ENOENT
        assert catalog.delete_inode(f) == [A]
        assert catalog.extents(f) == {} and errno_of(catalog.get_inode, f) == errno.ENOENT

    def test_commit_file_replaces_an_extent_and_keeps_shared_chunks(self, catalog: Catalog) -> None:
        f = one_chunk_file(catalog, b"f", A)
        g = one_chunk_file(catalog, b"g", A)  # the same content: one chunk, two extents
        assert catalog.commit_file(f, 10, 3, 3, 16, {0: ChunkRef(B, 10, ("l",))}) == [A]
        assert catalog.drop_unreferenced([A]) == {}  # g still names it
        assert catalog.extents(g)[0].digest == A and catalog.extents(f)[0].digest == B
        assert sorted(catalog.all_extents()) == sorted([(f, 0, B, 10), (g, 0, A, 10)])
        assert catalog.digests_under(["/"]) == {A: 10, B: 10}
        assert catalog.get_inode(f).mtime_ns == 3

    def test_extent_replicas_and_storage_per_tier(self, catalog: Catalog) -> None:
        f = one_chunk_file(catalog, b"f", A, ("local0",))
        g = one_chunk_file(catalog, b"g", B, ("remote0",))
        got = sorted((e.ino, e.digest, e.length, e.on_tiers)
                     for e in catalog.extent_replicas([f, g], ["local0"]))
        assert got == [(f, A, 10, True), (g, B, 10, False)]
        assert all(not e.on_tiers for e in catalog.extent_replicas([f, g], []))
        many = [*range(10_000, 12_000), g]  # several batches (SQLite: 900 per statement)
        assert [(e.ino, e.on_tiers) for e in catalog.extent_replicas(many, ["remote0"])] == [(g, True)]
        assert catalog.stored_on_tier("local0") == (1, 10)
        assert catalog.stored_on_tier("none") == (0, 0)
        assert catalog.stored_by_tier() == {"local0": (1, 10), "remote0": (1, 10)}

    # -- replicas and upload jobs ------------------------------------------------------------

    def test_commit_queues_uploads_and_finishing_one_records_the_replica(self, catalog: Catalog) -> None:
        f = one_chunk_file(catalog, b"f", A, uploads={A: ["s3"]}, mtime_ns=5)
        one_chunk_file(catalog, b"g", B, ("l", "s3"), uploads={B: ["s3"]})  # already there
        [job] = catalog.due_uploads(now_ns=10, limit=10, skip=set())
        assert (job.digest, job.tier, job.length, job.enqueued_ns, job.attempts, job.sources) == (
            A, "s3", 10, 5, 0, ("l",))
        assert catalog.upload_job_pairs() == {(A, "s3")}
        assert catalog.pending_digests([A, B]) == 1 and catalog.pending_uploads_for([f]) == 1
        assert catalog.due_uploads(10, 10, skip={(A, "s3")}) == []
        assert catalog.backlog().chunks == 1 and catalog.backlog().bytes == 10
        assert catalog.finish_upload(A, "s3")
        assert catalog.replica_tiers(A) == ("l", "s3")
        assert catalog.extents(f)[0].tiers == ("l", "s3")
        assert catalog.backlog().chunks == 0 and catalog.next_upload_due_ns(set()) is None

    def test_a_node_is_given_only_the_uploads_its_own_tiers_can_serve(
        self, catalog: Catalog
    ) -> None:
        # Two nodes of a shared catalog: each chunk is on one node's local tier only.
        one_chunk_file(catalog, b"a", A, ("a:l",), uploads={A: ["s3"]}, mtime_ns=1)
        one_chunk_file(catalog, b"b", B, ("b:l",), uploads={B: ["s3"]}, mtime_ns=2)
        assert {j.digest for j in catalog.due_uploads(10, 10, set())} == {A, B}
        assert [j.digest for j in catalog.due_uploads(10, 10, set(), ["a:l"])] == [A]
        assert [j.digest for j in catalog.due_uploads(10, 10, set(), ["b:l", "x"])] == [B]
        assert catalog.due_uploads(10, 10, set(), []) == []
        assert catalog.due_uploads_of([A, B], 10, 10, set(), ["b:l"])[0].digest == B
        assert len(catalog.due_uploads_of([A, B], 10, 10, set(), ["b:l"])) == 1
        catalog.postpone_upload(A, "s3", 500, "slow", False)
        assert catalog.next_upload_due_ns(set(), ["a:l"]) == 500
        assert catalog.next_upload_due_ns(set(), ["c:l"]) is None

    def test_files_not_durable_are_listed_by_the_local_tier_holding_them(
        self, catalog: Catalog
    ) -> None:
        fa = one_chunk_file(catalog, b"a", A, ("a:l",), uploads={A: ["s3"]})
        fb = one_chunk_file(catalog, b"b", B, ("b:l", "s3"))  # on the remote already
        fc = one_chunk_file(catalog, b"c", C, ("b:l",), uploads={C: ["s3"]})
        assert catalog.not_durable_files() == {"a:l": {fa}, "b:l": {fc}}
        assert catalog.finish_upload(A, "s3")
        assert catalog.not_durable_files() == {"b:l": {fc}}
        assert fb not in set().union(*catalog.not_durable_files().values())

    def test_a_postponed_upload_waits_and_reports_its_error(self, catalog: Catalog) -> None:
        one_chunk_file(catalog, b"f", A, uploads={A: ["s3"]})
        catalog.postpone_upload(A, "s3", next_try_ns=1_000, error="timeout", blocked=True)
        assert catalog.due_uploads(999, 10, set()) == []
        assert catalog.next_upload_due_ns(set()) == 1_000
        [job] = catalog.due_uploads_of([A], 1_000, 10, set())
        assert job.attempts == 1
        b = catalog.backlog()
        assert (b.chunks, b.blocked, b.last_error) == (1, 1, "timeout")

    def test_postponed_uploads_are_due_at_once_when_their_tier_works(
        self, catalog: Catalog
    ) -> None:
        one_chunk_file(catalog, b"f", A, uploads={A: ["s3"]})
        one_chunk_file(catalog, b"g", B, uploads={B: ["s3"]})
        catalog.postpone_upload(A, "s3", next_try_ns=1_000, error="timeout", blocked=False)
        catalog.postpone_upload(B, "s3", next_try_ns=1_000, error="denied", blocked=True)
        assert catalog.retry_uploads_now("other") == 0
        assert catalog.retry_uploads_now("s3") == 1
        assert [j.digest for j in catalog.due_uploads(0, 10, set())] == [A]

    def test_an_upload_cancelled_meanwhile_queues_its_copy_for_deletion(self, catalog: Catalog) -> None:
        one_chunk_file(catalog, b"f", A, uploads={A: ["s3"]})
        assert catalog.drop_upload_jobs([A]) == 1
        assert not catalog.finish_upload(A, "s3")  # the copy made is garbage
        assert catalog.deletion_keys("s3") == {A}
        assert catalog.replica_tiers(A) == ("l",)

    def test_uploads_finished_together_are_recorded_in_one_call(self, catalog: Catalog) -> None:
        one_chunk_file(catalog, b"f", A, uploads={A: ["s3"]})
        one_chunk_file(catalog, b"g", B, uploads={B: ["s3"]})
        one_chunk_file(catalog, b"h", C, uploads={C: ["s3"]})
        assert catalog.drop_upload_jobs([B]) == 1  # B's job was cancelled meanwhile
        assert catalog.finish_uploads([(A, "s3"), (B, "s3"), (C, "s3")]) == {
            (A, "s3"): True, (B, "s3"): False, (C, "s3"): True}
        assert catalog.replica_tiers(A) == catalog.replica_tiers(C) == ("l", "s3")
        assert catalog.replica_tiers(B) == ("l",)
        assert catalog.deletion_keys("s3") == {B}  # its copy is garbage
        assert catalog.upload_job_pairs() == set()
        assert not catalog.snapshot_is_current()  # a change the next snapshot must hold

    def test_requeue_and_queue_upload(self, catalog: Catalog) -> None:
        one_chunk_file(catalog, b"f", A, ("l", "s3"))
        assert catalog.queue_upload(A, "s3")  # replica rows are left alone
        assert not catalog.queue_upload(A, "s3")  # queued already
        assert catalog.replica_tiers(A) == ("l", "s3")
        assert not catalog.queue_upload(C, "s3")  # an unknown chunk
        catalog.finish_upload(A, "s3")
        assert catalog.requeue_upload(A, "s3")  # the remote copy is bad: forget it, copy again
        assert catalog.replica_tiers(A) == ("l",)
        assert catalog.upload_job_pairs() == {(A, "s3")}
        assert not catalog.requeue_upload(C, "s3")

    def test_bad_and_healed_replicas(self, catalog: Catalog) -> None:
        f = one_chunk_file(catalog, b"f", A, ("l", "m"))
        catalog.mark_replica_bad(A, "m")
        assert catalog.replica_tiers(A) == ("l",) and catalog.extents(f)[0].tiers == ("l",)
        assert catalog.replica_keys("m") == {A}  # the row is still there, just not valid
        assert catalog.add_replica_if_known(A, "m")
        assert catalog.replica_tiers(A) == ("l", "m")
        assert not catalog.add_replica_if_known(C, "m")  # dropped meanwhile: delete the copy
        assert catalog.deletion_keys("m") == {C}
        catalog.remove_replica(A, "m")
        catalog.add_replica(B, "m", 4)  # fsck adopting a frame it found
        assert catalog.replica_keys("m") == {B} and catalog.chunk_length(B) == 4
        assert catalog.replica_keys_all() == {A, B}

    def test_eviction_of_local_copies_backed_by_a_remote(self, catalog: Catalog) -> None:
        one_chunk_file(catalog, b"old", A, ("l", "s3"), mtime_ns=1)
        one_chunk_file(catalog, b"new", B, ("l", "s3"), mtime_ns=2)
        one_chunk_file(catalog, b"pending", C, ("l",), uploads={C: ["s3"]}, mtime_ns=0)
        assert catalog.eviction_candidates(["l"], ["s3"], 10) == [(A, "l", 10), (B, "l", 10)]
        assert catalog.eviction_candidates(["l"], [], 10) == []
        assert catalog.forget_local_replica(A, "l", ["s3"])
        assert not catalog.forget_local_replica(C, "l", ["s3"])  # not uploaded yet
        assert catalog.replica_tiers(A) == ("s3",) and catalog.deletion_keys("l") == {A}

    # -- the deletion queue ------------------------------------------------------------------

    def test_dropped_chunks_are_queued_for_deletion_and_deleted(self, catalog: Catalog) -> None:
        f = one_chunk_file(catalog, b"f", A, ("l",), uploads={A: ["s3"]})
        catalog.unlink(R, b"f")
        catalog.delete_inode(f)
        assert catalog.drop_unreferenced([A], extra_tiers={A: {"x"}}) == {A: ["l", "x"]}
        assert all(catalog.deletion_keys(t) == {A} for t in ("l", "s3", "x"))
        due = catalog.due_deletions(now_ns=2**62, limit=10, skip=set(), tiers=["l", "s3"])
        assert sorted((d.digest, d.tier, d.length, d.attempts) for d in due) == [
            (A, "l", 10, 0), (A, "s3", 10, 0)]
        assert catalog.due_deletions(2**62, 10, set(), []) == []
        assert catalog.claim_deletions([(A, "l")]) == [(A, "l")]
        catalog.postpone_deletion(A, "l", next_try_ns=50, error="EIO")
        assert catalog.next_deletion_due_ns({(A, "s3")}, ["l", "s3"]) == 50
        [q] = [q for q in catalog.deletion_backlog() if q.tier == "l"]
        assert (q.chunks, q.bytes, q.failing, q.last_error) == (1, 10, 1, "EIO")
        assert catalog.deletions_pending([A, B], due_before_ns=49) == {A}  # s3's row is due
        assert catalog.retry_deletions_now("l") == 1
        catalog.finish_deletions([(A, "l"), (A, "s3"), (A, "x")])
        assert catalog.deletions_pending([A]) == set() and catalog.deletion_backlog() == []

    def test_a_deletion_is_cancelled_when_the_chunk_is_wanted_again(self, catalog: Catalog) -> None:
        assert catalog.queue_deletions([(A, "l"), (B, "l"), (C, "l")]) == 3
        one_chunk_file(catalog, b"f", A, ("l",))  # A is back on l
        one_chunk_file(catalog, b"g", B, ("m",), uploads={B: ["l"]})  # B is to be copied to l
        catalog.finish_deletions([(C, "l")])  # C is done by someone else
        assert catalog.claim_deletions([(A, "l"), (B, "l"), (C, "l")]) == []
        assert catalog.deletion_keys("l") == set()

    def test_a_claimed_remote_deletion_holds_the_uploads_of_its_pair(
        self, catalog: Catalog
    ) -> None:
        """Objects are keyed by digest: while a deleter deletes (A, s3), an upload of the
        same bytes (another node's commit) must not run or be recorded before it is done."""
        assert catalog.queue_deletions([(A, "s3"), (B, "s3")]) == 2
        assert catalog.claim_deletions([(A, "s3")], lease_end()) == [(A, "s3")]
        now = time.time_ns()
        assert [d.digest for d in catalog.due_deletions(now, 10, set(), ["s3"])] == [B]
        assert catalog.claim_deletions([(A, "s3")], lease_end()) == []  # leased: not twice
        lease = catalog.next_deletion_due_ns({(B, "s3")}, ["s3"])
        assert lease is not None and lease > now
        catalog.queue_deletions([(A, "s3")])  # queued again: still claimed
        assert catalog.retry_deletions_now() == 0  # a claim is no postponed row
        assert [d.digest for d in catalog.due_deletions(now, 10, set(), ["s3"])] == [B]
        f = one_chunk_file(catalog, b"f", A, uploads={A: ["s3"]})  # the same bytes again
        one_chunk_file(catalog, b"g", B, uploads={B: ["s3"]})
        assert catalog.deletion_keys("s3") == {A}  # B's unclaimed row cancelled, A's kept
        assert [j.digest for j in catalog.due_uploads(2**62, 10, set())] == [B]
        assert catalog.due_uploads_of([A], 2**62, 10, set()) == []
        assert catalog.finish_uploads([(A, "s3"), (B, "s3")]) == {(A, "s3"): False, (B, "s3"): True}
        assert catalog.upload_job_pairs() == {(A, "s3")}  # A's job stays
        # Held by the claim: its end is an event (deletion_events.py), its lease's end (a
        # claimant that died) the deadline.
        assert catalog.next_upload_due_ns(set()) == lease
        catalog.finish_deletions([(A, "s3")])
        [job] = catalog.due_uploads(2**62, 10, set())
        assert job.digest == A and job.enqueued_ns > 1  # restamped by the deletion's end
        assert not catalog.finish_uploads([(A, "s3")], {(A, "s3"): 1})[(A, "s3")]  # an older job's
        assert catalog.finish_uploads([(A, "s3")], {(A, "s3"): job.enqueued_ns})[(A, "s3")]
        assert catalog.extents(f)[0].tiers == ("l", "s3")

    def test_a_postponed_claim_is_due_again_and_cancelled_by_a_new_upload(
        self, catalog: Catalog
    ) -> None:
        catalog.queue_deletions([(A, "s3")])
        assert catalog.claim_deletions([(A, "s3")], lease_end()) == [(A, "s3")]
        catalog.postpone_deletion(A, "s3", next_try_ns=50, error="timeout")  # claim ends
        assert [d.digest for d in catalog.due_deletions(50, 10, set(), ["s3"])] == [A]
        one_chunk_file(catalog, b"f", A, uploads={A: ["s3"]})
        assert catalog.deletion_keys("s3") == set()
        assert [j.digest for j in catalog.due_uploads(2**62, 10, set())] == [A]

    def test_a_claims_end_is_written_only_while_it_holds_the_row(self, catalog: Catalog) -> None:
        """Finish, postpone and release with a lease value touch only a row still claimed
        with that value: a deleter whose lease ran out (the row is another's now), or whose
        claim never committed, changes nothing."""
        catalog.queue_deletions([(A, "s3"), (B, "s3"), (C, "s3")])
        mine, theirs = lease_end(), lease_end() + 1
        assert catalog.claim_deletions([(A, "s3"), (B, "s3")], mine) == [(A, "s3"), (B, "s3")]
        catalog.finish_deletions([(A, "s3")], theirs)  # not that claim's: kept
        catalog.postpone_deletion(A, "s3", 50, "timeout", theirs)
        assert catalog.release_deletion_claims([(A, "s3"), (C, "s3")], theirs) == 0
        assert catalog.deletion_keys("s3") == {A, B, C}
        assert [d.digest for d in catalog.due_deletions(time.time_ns(), 10, set(), ["s3"])] == [C]
        f = one_chunk_file(catalog, b"f", B, uploads={B: ["s3"]})  # held by the claim of B
        assert catalog.release_deletion_claims([(B, "s3"), (C, "s3")], mine) == 1  # C: unclaimed
        [job] = catalog.due_uploads(2**62, 10, set())  # released: the job is due
        assert job.digest == B and job.enqueued_ns > 1  # restamped as at a deletion's end
        assert catalog.claim_deletions([(B, "s3")], lease_end()) == []  # wanted again: cancelled
        catalog.finish_deletions([(A, "s3")], mine)
        assert catalog.deletion_keys("s3") == {C}
        assert catalog.finish_uploads([(B, "s3")], {(B, "s3"): job.enqueued_ns})[(B, "s3")]
        assert catalog.extents(f)[0].tiers == ("l", "s3")
        assert catalog.claim_deletions([(C, "s3")], mine) == [(C, "s3")]
        catalog.postpone_deletion(C, "s3", 50, "timeout", mine)  # the claim ends: due at 50
        assert [d.digest for d in catalog.due_deletions(50, 10, set(), ["s3"])] == [C]

    def test_a_claim_kept_after_a_delete_in_doubt_holds_uploads_until_released(
        self, catalog: Catalog
    ) -> None:
        """A DELETE that failed in doubt (it may still land): the row is postponed with its
        claim kept, a new lease until the grace's end. The attempt and its error are kept
        for ``ckptfs status``; no upload of the pair is due or recorded until the deleter
        releases that claim; the lease's end is the uploads' deadline meanwhile."""
        catalog.queue_deletions([(A, "s3")])
        mine = lease_end()
        assert catalog.claim_deletions([(A, "s3")], mine) == [(A, "s3")]
        grace_end = time.time_ns() + 130 * 10**9
        catalog.postpone_deletion(A, "s3", grace_end, "read timeout", mine, keep_claim=True)
        [backlog] = catalog.deletion_backlog()
        assert (backlog.chunks, backlog.failing, backlog.last_error) == (1, 1, "read timeout")
        now = time.time_ns()
        assert catalog.due_deletions(now, 10, set(), ["s3"]) == []  # still claimed
        assert catalog.next_deletion_due_ns(set(), ["s3"]) == grace_end
        assert catalog.retry_deletions_now() == 0  # a kept claim is no postponed row
        assert catalog.claim_deletions([(A, "s3")], lease_end()) == []  # not another's
        f = one_chunk_file(catalog, b"f", A, uploads={A: ["s3"]})  # the same bytes again
        assert catalog.deletion_keys("s3") == {A}  # claimed: not cancelled by the job
        assert catalog.due_uploads(2**62, 10, set()) == []
        assert catalog.due_uploads_of([A], 2**62, 10, set()) == []
        assert catalog.finish_uploads([(A, "s3")]) == {(A, "s3"): False}  # a PUT not recorded
        assert catalog.next_upload_due_ns(set()) == grace_end
        assert catalog.release_deletion_claims([(A, "s3")], mine) == 0  # the old claim's value
        [row] = catalog.due_deletions(grace_end, 10, set(), ["s3"])  # its lease over: due
        assert (row.digest, row.attempts) == (A, 1)
        t0 = time.time_ns()
        assert catalog.release_deletion_claims([(A, "s3")], grace_end) == 1  # the grace ended
        [job] = catalog.due_uploads(2**62, 10, set())
        assert job.digest == A and job.enqueued_ns >= t0  # restamped as at a deletion's end
        assert catalog.claim_deletions([(A, "s3")], lease_end()) == []  # wanted: cancelled
        assert catalog.deletion_keys("s3") == set()
        assert catalog.finish_uploads([(A, "s3")], {(A, "s3"): job.enqueued_ns})[(A, "s3")]
        assert catalog.extents(f)[0].tiers == ("l", "s3")

    def test_a_claim_whose_lease_ran_out_cancelled_by_a_job_lets_the_job_run(
        self, catalog: Catalog
    ) -> None:
        """A claim's lease ran out (its deleter died): the next claim finds the chunk wanted
        again and cancels the row, and the job the claim held runs (restamped, as at any
        claim's end)."""
        catalog.queue_deletions([(A, "s3")])
        assert catalog.claim_deletions([(A, "s3")], time.time_ns() - 1) == [(A, "s3")]
        one_chunk_file(catalog, b"f", A, uploads={A: ["s3"]})
        assert catalog.due_uploads(2**62, 10, set()) == []  # held until a deleter ends it
        # Its lease's end has passed: no deadline (a past one would spin the uploader); the
        # claim's end by the deleter that takes the row over is the event.
        assert catalog.next_upload_due_ns(set()) is None
        t0 = time.time_ns()
        assert catalog.claim_deletions([(A, "s3")], lease_end()) == []
        assert catalog.deletion_keys("s3") == set()
        [job] = catalog.due_uploads(2**62, 10, set())
        assert job.digest == A and job.enqueued_ns >= t0

    # -- moves of uncommitted chunks (catalog/moves.py) ------------------------------------

    def test_a_move_waits_for_a_claimed_deletion_of_its_pair(self, catalog: Catalog) -> None:
        """A PUT now could land before that DELETE: refused, nothing recorded, until the
        deletion is done."""
        catalog.queue_deletions([(A, "s3")])
        assert catalog.claim_deletions([(A, "s3")], lease_end()) == [(A, "s3")]
        assert not catalog.begin_move(A, 10, ["s3", "s4"], "n1")
        assert catalog.chunk_moves() == []
        catalog.postpone_deletion(A, "s3", next_try_ns=2**62, error="timeout")  # claim ended
        assert catalog.begin_move(A, 10, ["s3", "s4"], "n1")
        assert catalog.chunk_moves() == [(A, "s3", "n1"), (A, "s4", "n1")]
        assert catalog.deletion_keys("s3") == set()  # the postponed row is cancelled

    def test_a_move_cancels_unclaimed_deletions_and_any_claimed_after_it(
        self, catalog: Catalog
    ) -> None:
        catalog.queue_deletions([(A, "s3"), (B, "s3")])
        assert catalog.begin_move(A, 10, ["s3"], "n1")
        assert catalog.deletion_keys("s3") == {B}
        catalog.queue_deletions([(A, "s3")])  # another node drops the same bytes
        assert catalog.claim_deletions([(A, "s3"), (B, "s3")], lease_end()) == [(B, "s3")]
        assert catalog.deletion_keys("s3") == {B}  # A's row cancelled: the move wants it
        assert catalog.begin_move(A, 10, ["s3"], "n1")  # again (a retried PUT): one row
        assert catalog.chunk_moves() == [(A, "s3", "n1")]

    def test_the_end_of_a_move_queues_only_objects_nothing_wants(self, catalog: Catalog) -> None:
        for d in (A, B, C):
            assert catalog.begin_move(d, 10, ["s3"], "n1")
        assert catalog.begin_move(C, 10, ["s3"], "n2")  # the same bytes moved by another node
        one_chunk_file(catalog, b"f", A, ("s3",))  # A committed there: its replica row
        pairs = [(A, "s3"), (B, "s3"), (C, "s3")]
        assert catalog.end_moves(pairs, "n1") == 1
        assert catalog.deletion_keys("s3") == {B}  # dropped uncommitted
        assert catalog.chunk_moves() == [(C, "s3", "n2")]
        assert catalog.end_moves(pairs, "n1") == 0  # ended already
        assert catalog.claim_deletions([(B, "s3")], lease_end()) == [(B, "s3")]
        assert catalog.end_moves([(C, "s3")], "n2") == 1
        assert catalog.deletion_keys("s3") == {B, C}

    def test_moves_left_by_a_node_are_released(self, catalog: Catalog) -> None:
        assert catalog.begin_move(A, 10, ["s3"], "n1")
        assert catalog.begin_move(B, 10, ["s3"], "n2")
        one_chunk_file(catalog, b"g", B, ("n2:l",), uploads={B: ["s3"]})  # B's job wants it
        assert catalog.release_moves("n1") == 1
        assert catalog.deletion_keys("s3") == {A}
        assert catalog.release_moves() == 0
        assert catalog.chunk_moves() == [] and catalog.deletion_keys("s3") == {A}

    def test_the_end_of_a_session_releases_its_nodes_moves(self, catalog: Catalog) -> None:
        sid = catalog.register_session("n1", 30).sid
        assert catalog.begin_move(A, 10, ["s3"], "n1")
        assert catalog.begin_move(B, 10, ["s3"], "n2")
        catalog.close_session(sid)
        assert catalog.chunk_moves() == [(B, "s3", "n2")]
        assert catalog.deletion_keys("s3") == {A}

    # -- sessions: a restart on the same state dir -------------------------------------------

    def test_a_live_session_of_the_callers_earlier_id_is_ended_and_replaced(
        self, catalog: Catalog,
    ) -> None:
        """The caller names its state dir's earlier session (its daemon is dead: the caller
        holds that state dir's lock): ended at once, as an expired one would be."""
        old = catalog.register_session("n1", 60, "pid 1").sid
        run = catalog.create(R, b"run", D, 0, 0).ino
        step = catalog.create(run, b"step-1", D, 0, 0).ino
        shard = one_chunk_file(catalog, b"shard", A)
        catalog.rename(R, b"shard", step, b"shard", False)
        gone = one_chunk_file(catalog, b"scratch", B)
        catalog.note_open(old, shard, writing=True)
        catalog.note_open(old, gone)
        catalog.unlink(R, b"scratch")  # held open by the dead daemon only
        assert catalog.checkpoint_begin("/run/step-1", "torch", 1, 10)
        reg = catalog.register_session("n1", 60, "pid 2", "new-sid", old)
        assert reg.sid == "new-sid"
        assert reg.previous == SessionEnd(old, "n1", 2, (gone,), (B,), ("/run/step-1",))
        assert [(s.sid, s.node, s.info, s.live) for s in catalog.sessions()] == [
            ("new-sid", "n1", "pid 2", True)]
        assert not catalog.heartbeat_session(old, 60)  # the old id is gone for good
        assert catalog.heartbeat_session("new-sid", 60)
        assert catalog.open_inodes() == set()
        assert errno_of(catalog.get_inode, gone) == errno.ENOENT
        [row] = catalog.checkpoint_rows("/run/step-1")
        assert row.state is CheckpointState.PARTIAL and "its node n1 restarted" in (row.reason or "")
        assert catalog.get_inode(shard).size == 10  # its last commit stays

    def test_a_live_session_of_another_id_is_still_refused(self, catalog: Catalog) -> None:
        live = catalog.register_session("n1", 60, "pid 1").sid
        for earlier in ("", "some-other-daemons-sid"):
            with pytest.raises(UsageError, match="node 'n1' has a live session"):
                catalog.register_session("n1", 60, "pid 2", "new-sid", earlier)
        with pytest.raises(UsageError, match="'n1'"):  # another node's id names nothing here
            catalog.register_session("n1", 60, "", None, catalog.register_session("n2", 60).sid)
        assert sorted((s.sid == live, s.node) for s in catalog.sessions()) == [
            (False, "n2"), (True, "n1")]
        assert catalog.heartbeat_session(live, 60)

    def test_a_retried_registration_whose_reply_was_lost_returns_its_id(
        self, catalog: Catalog,
    ) -> None:
        """The same id again (its first attempt committed): the same session, extended, with
        nothing ended a second time; an earlier id named with it changes nothing."""
        old = catalog.register_session("n1", 60).sid
        first = catalog.register_session("n1", 60, "", "attempt", old)
        assert first.sid == "attempt" and first.previous == SessionEnd(old, "n1")
        for earlier in (old, ""):
            assert catalog.register_session("n1", 60, "", "attempt", earlier) == \
                Registered("attempt", None)
        assert [s.sid for s in catalog.sessions()] == ["attempt"]

    # -- checkpoints -------------------------------------------------------------------------

    def test_checkpoint_rows_and_states(self, catalog: Catalog) -> None:
        assert catalog.checkpoint_begin("/run/step-1", "torch", 1, 10)
        assert not catalog.checkpoint_begin("/run/step-1", "torch", 1, 11)  # writing already
        [row] = catalog.checkpoint_rows("/run")
        assert row == CheckpointRow(row.id, "/run/step-1", "torch", 1, CheckpointState.WRITING,
                                    10, None, None, "")
        catalog.checkpoint_commit("/run/step-1", "torch", None, 20, "marker")
        [row] = catalog.checkpoint_rows("/run/step-1")
        assert (row.state, row.step, row.begin_ns, row.commit_ns, row.reason) == (
            CheckpointState.COMMITTED, 1, 10, 20, "marker")
        assert catalog.checkpoint_begin("/run/step-1", "torch", 1, 30)  # overwritten: starts over
        assert catalog.checkpoint_rows("/run/step-1")[0].commit_ns is None
        catalog.checkpoint_commit("/run/step-2", "hf", 2, 40, "dir")  # a commit with no begin
        catalog.checkpoint_set_state("/run/step-1", CheckpointState.PARTIAL, "no writer")
        assert errno_of(catalog.checkpoint_set_state, "/run/step-1", "bogus") == errno.EINVAL
        assert [(r.root, r.state, r.reason) for r in catalog.checkpoint_rows("/")] == [
            ("/run/step-1", CheckpointState.PARTIAL, "no writer"),
            ("/run/step-2", CheckpointState.COMMITTED, "dir")]
        assert catalog.checkpoint_rows("/ru") == []  # a prefix of a name is not "under"
        # The mapping view carries the stored strings (JSON output as before).
        assert json.dumps(catalog.checkpoint_rows("/run/step-2")[0].as_dict()["state"]) == \
            '"committed"'
        assert json.dumps(catalog.checkpoint_rows("/run/step-2")[0].state) == '"committed"'

    def test_checkpoint_paths_with_like_wildcards_are_literal(self, catalog: Catalog) -> None:
        catalog.checkpoint_commit("/a_b/c", "torch", 1, 1, "x")
        catalog.checkpoint_commit("/axb/c", "torch", 1, 1, "x")
        catalog.checkpoint_commit("/a%/c", "torch", 1, 1, "x")
        assert [r.root for r in catalog.checkpoint_rows("/a_b")] == ["/a_b/c"]
        assert [r.root for r in catalog.checkpoint_rows("/a%")] == ["/a%/c"]

    def test_names_that_are_not_utf8_round_trip_as_checkpoint_roots(self, catalog: Catalog) -> None:
        # Names are bytes: a daemon path carries the undecodable ones as surrogate escapes
        # (issue 33: x-\xff renamed to y ended the daemon in rename_checkpoints).
        d = catalog.create(R, b"run-\xff", D, 0, 0)
        catalog.create(d.ino, b"checkpoint-\xfe1", D, 0, 0)
        top, root = "/run-\udcff", "/run-\udcff/checkpoint-\udcfe1"
        assert catalog.path_of(d.ino) == top
        assert catalog.resolve(root) is not None
        assert catalog.list_names(d.ino) == ["checkpoint-\udcfe1"]
        assert catalog.checkpoint_begin(root, "hf", 1, 10)
        catalog.checkpoint_commit(root, "hf", 1, 20, "rename tmp-\udcfe -> checkpoint-\udcfe1")
        catalog.checkpoint_commit("/run-\udcfe/checkpoint-1", "hf", 1, 30, "x")  # another byte
        [row] = catalog.checkpoint_rows(top)
        assert (row.root, row.state) == (root, CheckpointState.COMMITTED)
        assert row.reason == "rename tmp-\\xfe -> checkpoint-\\xfe1"  # readable text
        assert catalog.checkpoint_tag(root, "best")
        assert catalog.checkpoint_set_state(root, CheckpointState.EXPIRED, "retention \udcff")
        catalog.checkpoint_leftover(root, [A])
        assert catalog.expired_leftovers() == {root: [A]}
        catalog.rename_checkpoints("/x-\udcff", "/y")  # a file that is no checkpoint
        catalog.rename_checkpoints(top, "/y-\udcfd")
        assert [r.root for r in catalog.checkpoint_rows("/y-\udcfd")] == [
            "/y-\udcfd/checkpoint-\udcfe1"]
        assert catalog.checkpoint_rows(top) == []
        assert [r.root for r in catalog.checkpoint_rows("/")] == [
            "/y-\udcfd/checkpoint-\udcfe1", "/run-\udcfe/checkpoint-1"]

    def test_audit_records_of_names_that_are_not_utf8(self, catalog: Catalog) -> None:
        from ckptfs.catalog.audit import AuditRecord, verify_chain

        f = catalog.create(R, b"x-\xff", F, 0, 0, audit=AuditRecord("create", uid=5))
        catalog.audit_append(AuditRecord("refused", path="/x-\udcff\\xff", uid=5,
                                         detail={"name": "x-\udcff"}))
        catalog.commit_file(f.ino, 10, 1, 1, 16, {0: ChunkRef(A, 10, ("l",))})
        got = catalog.audit_entries()
        assert [e.path for e in got][:2] == ["/x-\\xff", "/x-\\xff\\xff"]
        assert json.loads(got[1].detail) == {"name": "x-\udcff"}
        assert verify_chain(got, catalog.audit_genesis()) == []
        json.dumps([e.as_json() for e in got])  # ASCII JSON: the escapes, no error

    def test_checkpoint_tags_leftovers_and_renames(self, catalog: Catalog) -> None:
        catalog.checkpoint_commit("/run/step-1", "torch", 1, 1, "x")
        assert catalog.checkpoint_tag("/run/step-1", "milestone")
        assert catalog.checkpoint_tag("/run/step-1", "best")
        assert not catalog.checkpoint_tag("/nope", "best")
        assert catalog.checkpoint_rows("/run")[0].tag_set == {"best", "milestone"}
        catalog.checkpoint_set_state("/run/step-1", CheckpointState.EXPIRED, "retention")
        catalog.checkpoint_leftover("/run/step-1", [A])
        assert catalog.expired_leftovers() == {"/run/step-1": [A]}
        catalog.checkpoint_leftover("/run/step-1", [])
        assert catalog.expired_leftovers() == {}
        catalog.checkpoint_commit("/new/step-1", "torch", 1, 2, "x")
        catalog.rename_checkpoints("/run", "/new")  # the run moved over an older row
        [row] = catalog.checkpoint_rows("/new")
        assert (row.root, row.state, row.tags) == ("/new/step-1", CheckpointState.EXPIRED, "best,milestone")
        assert catalog.checkpoint_rows("/run") == []

    def test_a_rename_that_moves_no_checkpoint_writes_nothing(
        self, catalog: Catalog, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # The tracker asks this for every renamed file; only a checkpoint's move writes.
        catalog.checkpoint_commit("/run/step-1", "torch", 1, 1, "x")
        writes: list[object] = []
        real = catalog._transaction  # type: ignore[attr-defined]

        def counted(*args: object, **kw: object) -> object:
            writes.append(args)
            return real(*args, **kw)

        monkeypatch.setattr(catalog, "_transaction", counted)
        catalog.rename_checkpoints("/run/step-1.tmp", "/run/step-2")
        catalog.rename_checkpoints("/ru", "/x")  # a prefix of a name is not "under"
        assert writes == []
        catalog.rename_checkpoints("/run", "/new")
        assert len(writes) == 1
        assert [r.root for r in catalog.checkpoint_rows("/")] == ["/new/step-1"]

    # -- meta --------------------------------------------------------------------------------

    def test_meta_and_recorded_tiers(self, catalog: Catalog) -> None:
        assert catalog.get_meta("nope") is None
        assert catalog.get_meta("fs_id")  # every catalog has an id
        catalog.set_meta("k", "1")
        catalog.set_meta("k", "2")
        assert catalog.get_meta("k") == "2"
        assert catalog.recorded_tiers() == []
        catalog.set_meta("tiers", json.dumps([{"name": "l", "kind": "local"}]))
        assert catalog.recorded_tiers() == [{"name": "l", "kind": "local"}]
        catalog.sync()

    def test_the_snapshot_is_stale_after_a_change(self, catalog: Catalog) -> None:
        catalog.create(R, b"f", F, 0, 0)
        assert not catalog.snapshot_is_current() and catalog.snapshot_of_ns() is None
        catalog.set_meta("snapshot_of_ns", str(2**62))
        assert catalog.snapshot_is_current() and catalog.snapshot_of_ns() == 2**62
        assert catalog.backup_bytes()  # a non-empty copy to store on the remotes

    # -- wants (chunks a reader on another node waits for) -----------------------------------

    def test_a_want_names_the_chunks_a_holder_uploads_first(self, catalog: Catalog) -> None:
        one_chunk_file(catalog, b"a", A, ("a:l",), uploads={A: ["s3"]}, mtime_ns=1)
        one_chunk_file(catalog, b"b", B, ("a:l",), uploads={B: ["s3"]}, mtime_ns=2)
        one_chunk_file(catalog, b"c", C, ("c:l",), uploads={C: ["s3"]}, mtime_ns=3)
        assert catalog.wanted_uploads(["a:l"]) == []
        catalog.want_chunks([B, C], "b:1", 60)
        catalog.want_chunks([B], "d:1", 60)  # two nodes wait for one chunk
        # Each holder is given the wanted chunks it can upload; None: every job.
        assert catalog.wanted_uploads(["a:l"]) == [B]
        assert catalog.wanted_uploads(["c:l", "x"]) == [C]
        assert catalog.wanted_uploads([]) == []
        assert sorted(catalog.wanted_uploads(None)) == [B, C]
        wants = catalog.chunk_wants()
        assert [(d, w) for d, w, _ in wants] == [(B, "b:1"), (B, "d:1"), (C, "b:1")]
        assert all(0 < left <= 60 * 10**9 for _, _, left in wants)
        # Uploaded: no job left, so no longer at the head of anyone's queue.
        assert catalog.finish_upload(B, "s3")
        assert catalog.wanted_uploads(["a:l"]) == []
        catalog.unwant_chunks([B, C], "b:1")
        assert [(d, w) for d, w, _ in catalog.chunk_wants()] == [(B, "d:1")]
        catalog.unwant_chunks([B], "d:1")
        assert catalog.chunk_wants() == [] and catalog.wanted_uploads(None) == []

    def test_a_stale_want_is_ignored_and_a_renewed_one_extended(self, catalog: Catalog) -> None:
        one_chunk_file(catalog, b"a", A, ("a:l",), uploads={A: ["s3"]})
        one_chunk_file(catalog, b"b", B, ("a:l",), uploads={B: ["s3"]})
        catalog.want_chunks([A], "dead:1", -1)  # a waiter that died: expired already
        assert catalog.wanted_uploads(["a:l"]) == [] and catalog.chunk_wants() == []
        catalog.want_chunks([A], "b:1", 60)
        catalog.want_chunks([A], "b:1", 120)  # renewed, not doubled
        [(digest, waiter, left)] = catalog.chunk_wants()
        assert (digest, waiter) == (A, "b:1") and 60 * 10**9 < left <= 120 * 10**9
        catalog.want_chunks([], "b:1", 60)  # nothing to want: nothing written
        assert catalog.wanted_uploads(["a:l"]) == [A]
