"""``ckptfs fsck`` checks the remote tiers too, against a real SeaweedFS and real mounts.

A deleted remote object and a corrupted one are found (the corrupt one with ``--verify``),
``--repair`` forgets them and queues their uploads again, and the next mount uploads them;
an orphan object is deleted. An unreachable remote is reported with exit 1 and changes
nothing; ``--local-only`` skips it. A prefix another live node holds is left alone.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import pytest

from tests.remote.test_remote_mount import remote_objects
from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON, Mount, mounted, run_cli
from tests.support.s3server import SeaweedServer, free_ports

from ckptfs.codec import frame

pytestmark = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)

MiB = 1 << 20


def local_chunk_files(m: Mount) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for t in m.locals for p in (t / "chunks").glob("*/*")}


def catalog_rows(state_dir: Path, sql: str) -> set[tuple[object, ...]]:
    conn = sqlite3.connect(f"file:{state_dir / 'catalog.sqlite'}?mode=ro", uri=True)
    try:
        return {tuple(r) for r in conn.execute(sql)}
    finally:
        conn.close()


def fsck(m: Mount, *extra: str) -> tuple[int, str]:
    res = run_cli("fsck", "--state-dir", str(m.state_dir), *extra, timeout=120)
    out = res.stdout + res.stderr
    assert "Traceback" not in out, out
    return res.returncode, out


def write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


@pytest.mark.slow
def test_fsck_finds_missing_corrupt_and_orphan_objects_and_repair_uploads_again(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str]  # noqa: F811
) -> None:
    url, prefix = remote
    client = seaweed.client()
    with mounted(tmp_path, 2, ("--chunk-size", "1MiB", "--remote", url)) as m:
        text = b"step 100 loss 0.25 lr 3e-4\n" * (MiB // 16)  # 1.6 MiB that lz4 shrinks
        files = {"a.bin": os.urandom(3 * MiB), "b.bin": os.urandom(2 * MiB + 5), "log.txt": text}
        for name, data in files.items():
            write(m.mountpoint / name, data)
        assert run_cli("sync", str(m.mountpoint), "--timeout", "60").returncode == 0
        m.stop()

        code, out = fsck(m, "--verify")
        assert code == 0 and "fsck: clean" in out and "checked: remote0" in out, out

        objects = remote_objects(seaweed, prefix)
        keys = sorted(objects)
        assert len(keys) == 8
        codecs = {k: frame.parse_header(raw).codec for k, raw in objects.items()}
        assert frame.Codec.LZ4 in codecs.values(), "no lz4 remote copy: --verify not shown on one"
        raw_keys = sorted(k for k, c in codecs.items() if c == frame.Codec.RAW)
        missing, corrupt = raw_keys[0], sorted(k for k, c in codecs.items() if c == frame.Codec.LZ4)[0]
        client.delete_object(Bucket=seaweed.bucket, Key=f"{prefix}/chunks/{missing}")
        client.put_object(Bucket=seaweed.bucket, Key=f"{prefix}/chunks/{corrupt}",
                          Body=os.urandom(4096))
        stray = os.urandom(MiB // 2)
        orphan = frame.digest_of(stray).hex()
        client.put_object(Bucket=seaweed.bucket, Key=f"{prefix}/chunks/{orphan}",
                          Body=b"".join(bytes(p) for p in frame.encode([stray], bytes.fromhex(orphan))))

        # An uncommitted chunk the daemon had moved there (its local tier full) when it
        # died: its move is still recorded (catalog/moves.py).
        left = os.urandom(MiB // 4)
        moved = frame.digest_of(left).hex()
        client.put_object(Bucket=seaweed.bucket, Key=f"{prefix}/chunks/{moved}",
                          Body=b"".join(bytes(p) for p in frame.encode([left], bytes.fromhex(moved))))
        conn = sqlite3.connect(m.state_dir / "catalog.sqlite")
        conn.execute("INSERT INTO chunk_moves VALUES (?, 'remote0', '', ?, 1)",
                     (bytes.fromhex(moved), len(left)))
        conn.commit()
        conn.close()

        code, out = fsck(m)
        assert code == 1, out
        assert f"chunk {missing[:16]} recorded on remote tier remote0 is missing there" in out, out
        assert f"orphan chunk {orphan[:16]} on remote tier remote0" in out, out
        assert "corrupt chunk" not in out, out  # found only by reading the objects

        code, out = fsck(m, "--verify")
        assert code == 1, out
        assert f"corrupt chunk {corrupt[:16]} on remote tier remote0" in out, out
        assert {orphan, corrupt} <= set(remote_objects(seaweed, prefix)), "fsck changed the remote"

        code, out = fsck(m, "--verify", "--repair")
        assert code == 1, out  # all repaired but the moved object kept (reported)
        assert "2 upload(s) re-queued" in out, out
        objects = remote_objects(seaweed, prefix)
        assert orphan not in objects and corrupt not in objects and missing not in objects
        assert moved in objects  # a recorded move: no orphan for --repair
        assert f"orphan chunk {moved[:16]} on remote tier remote0 (kept: an upload job or a " \
            "move of it is pending)" in out, out
        status = run_cli("status", "--state-dir", str(m.state_dir)).stdout
        assert "backlog: 2 chunk(s)" in status, status

        m.start()  # the queue is in the catalog: the daemon uploads both again
        res = run_cli("sync", str(m.mountpoint), "--timeout", "60")
        assert res.returncode == 0, res.stdout + res.stderr
        # One node: the mount ended the move an earlier run left; its object is deleted.
        deadline = time.monotonic() + 30
        while moved in remote_objects(seaweed, prefix):
            assert time.monotonic() < deadline, "the moved object left by a crash stayed"
            time.sleep(0.1)  # polling a condition, with a deadline
        assert not catalog_rows(m.state_dir, "SELECT * FROM chunk_moves")
        for name, data in files.items():
            assert (m.mountpoint / name).read_bytes() == data
        objects = remote_objects(seaweed, prefix)
        assert set(objects) == set(keys)
        for key, raw in objects.items():
            frame.verify(raw, bytes.fromhex(key))
        m.stop()

        code, out = fsck(m, "--verify")
        assert code == 0 and "fsck: clean" in out, out
    client.close()


def test_fsck_reports_an_unreachable_remote_and_changes_nothing(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str]  # noqa: F811
) -> None:
    url, prefix = remote
    with mounted(tmp_path, 2, ("--chunk-size", "1MiB", "--remote", url)) as m:
        write(m.mountpoint / "f.bin", os.urandom(2 * MiB))
        assert run_cli("sync", str(m.mountpoint), "--timeout", "60").returncode == 0
        m.stop()
        chunks = local_chunk_files(m)
        rows_sql = "SELECT digest, tier, state FROM replicas"
        rows = catalog_rows(m.state_dir, rows_sql)
        assert any(t == "remote0" for _d, t, _s in rows)

        # Same bucket and prefix, an endpoint where nothing listens.
        closed = free_ports(1)[0]
        dead = f"s3://{seaweed.bucket}/{prefix}?endpoint=http://127.0.0.1:{closed}"
        tier_args = [a for d in m.locals for a in ("--local", str(d))]
        code, out = fsck(m, *tier_args, "--remote", dead, "--repair", "--verify")
        assert code == 1, out
        assert "remote tier remote0" in out and "cannot be reached" in out, out
        assert str(closed) in out, out
        assert local_chunk_files(m) == chunks, "fsck touched local data"
        assert catalog_rows(m.state_dir, rows_sql) == rows, "fsck changed replica rows"
        assert not catalog_rows(m.state_dir, "SELECT * FROM upload_jobs")

        code, out = fsck(m, *tier_args, "--remote", dead, "--local-only")
        assert code == 0 and "fsck: clean" in out, out
        assert "remote tier remote0 not checked: skipped (--local-only)" in out, out


def test_fsck_leaves_a_prefix_held_by_a_live_writer_alone(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str]  # noqa: F811
) -> None:
    url, prefix = remote
    with mounted(tmp_path, 1, ("--chunk-size", "1MiB", "--remote", url)) as m:
        write(m.mountpoint / "f.bin", os.urandom(MiB))
        assert run_cli("sync", str(m.mountpoint), "--timeout", "60").returncode == 0
        m.stop()
        client = seaweed.client()
        stray_key = f"{prefix}/chunks/{'ab' * 32}"
        client.put_object(Bucket=seaweed.bucket, Key=stray_key, Body=b"another node's chunk")
        # Another node took the prefix over and is mounted (its heartbeat is fresh).
        client.put_object(Bucket=seaweed.bucket, Key=f"{prefix}/meta/writer", Body=json.dumps(
            {"version": 1, "writer_id": "e" * 32, "host": "node-b", "pid": 77,
             "state_dir": "/srv/ckptfs", "heartbeat": time.time(), "released": False}
        ).encode())
        code, out = fsck(m, "--repair")
        assert code == 1, out
        assert "remote tier remote0" in out and "in use by another writer" in out, out
        assert "node-b" in out, out
        client.head_object(Bucket=seaweed.bucket, Key=stray_key)  # still there
        client.close()
