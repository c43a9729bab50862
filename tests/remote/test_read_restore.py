"""Restoring from the remote tier: copy-back of sequential reads, `ckptfs prefetch`, mmap.

Every test runs a real mount on a real SeaweedFS (the session's ``seaweed`` fixture from
conftest.py). A "restored node" is the replacement of a lost one: a first node writes the
files, `ckptfs sync` makes them durable, its state dir and local tiers are deleted, and a
second node mounts an empty state dir on the same bucket prefix, so every chunk it serves
exists only on the remote until it is copied back.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON, Mount, mounted, run_cli
from tests.support.s3fixtures import remove_prefix
from tests.support.s3server import ACCESS_KEY, SECRET_KEY, SeaweedServer

from ckptfs.codec import frame
from ckptfs.commands.live import open_catalog
from ckptfs.commands.prefetch import chunk_status, local_tier_names
from ckptfs.stats import read_stats

# Every test restores a node from the bucket: slow by construction.
pytestmark = [pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON), pytest.mark.slow]

MiB = 1 << 20
CHUNK = MiB
MOUNT_ARGS = ("--chunk-size", "1MiB")


@pytest.fixture
def remote(seaweed: SeaweedServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh prefix in the test bucket, and credentials in the environment the CLI and
    the daemons inherit (the standard AWS chain)."""
    seaweed.start()  # a no-op while it runs; brings it back if an outage test left it down
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    prefix = f"rr-{uuid.uuid4().hex[:10]}"
    yield f"s3://{seaweed.bucket}/{prefix}?endpoint={seaweed.endpoint}"
    remove_prefix(seaweed, seaweed.bucket, prefix)


# -- helpers ---------------------------------------------------------------------------------


def write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for off in range(0, len(data), MiB):
            f.write(data[off : off + MiB])


def read_sequential(path: Path, block: int = MiB) -> bytes:
    out = bytearray()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(block):
            out += chunk
    return bytes(out)


def chunk_keys(files: dict[str, bytes]) -> set[str]:
    """The chunk keys (blake3 hex) the files are made of on a 1 MiB grid."""
    return {
        frame.digest_of(data[off : off + CHUNK]).hex()
        for data in files.values()
        for off in range(0, len(data), CHUNK)
    }


def local_chunk_keys(tiers: list[Path]) -> set[str]:
    return {p.name for t in tiers for p in (t / "chunks").glob("*/*")}


def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``cond`` until it returns something truthy; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def tier_reads(state_dir: Path) -> dict[str, int]:
    stats = read_stats(state_dir) or {}
    return {t["name"]: int(t["reads"]) for t in stats.get("tiers", ())}


def counter(state_dir: Path, name: str) -> int:
    stats = read_stats(state_dir) or {}
    return int(stats.get("counters", {}).get(name, 0))


def counter_eventually(m: Mount, name: str, at_least: int) -> int:
    def reached() -> int:
        c = counter(m.state_dir, name)
        return c if c >= at_least else 0

    return int(wait_for(reached, 30, f"stats counter {name} to reach {at_least}"))


def remote_only_chunks(m: Mount, paths: list[Path]) -> int:
    catalog = open_catalog(m.state_dir)
    try:
        inos = [os.stat(p).st_ino for p in paths]
        return chunk_status(catalog, inos, local_tier_names(catalog, m.state_dir)).remote_only
    finally:
        catalog.close()


def assert_log_clean(m: Mount) -> None:
    bad = [ln for ln in m.log.splitlines() if "ERROR" in ln or "Traceback" in ln]
    assert not bad, "ckptfs daemon logged errors:\n" + "\n".join(bad[:20])


@contextlib.contextmanager
def restored_node(
    tmp_path: Path, url: str, files: dict[str, bytes], n_local: int = 2,
    args: tuple[str, ...] = MOUNT_ARGS,
) -> Iterator[Mount]:
    """A node restored from the remote alone, serving ``files`` (relative paths); ``args``
    are the second node's mount options besides the remote."""
    first = tmp_path / "node1"
    with mounted(first, 2, (*MOUNT_ARGS, "--remote", url)) as m:
        for name, data in files.items():
            write(m.mountpoint / name, data)
        res = run_cli("sync", str(m.mountpoint), "--timeout", "60")
        assert res.returncode == 0, res.stdout + res.stderr
    shutil.rmtree(first)  # every local tier and the state dir are gone
    with mounted(tmp_path / "node2", n_local, (*args, "--remote", url)) as m:
        assert "restored the catalog" in m.log
        assert not local_chunk_keys(m.locals), "a restored node starts with empty local tiers"
        yield m


def checkpoint(n: int = 3) -> dict[str, bytes]:
    """A small checkpoint dir: multi-chunk shards with partial last chunks, and small files."""
    files = {f"ckpt/shard{i}.bin": os.urandom(3 * CHUNK + 1000 * i + 17) for i in range(n)}
    files["ckpt/sub/optim.bin"] = os.urandom(2 * CHUNK)
    files["ckpt/meta.json"] = b'{"step": 100}'
    return files


# -- tests -----------------------------------------------------------------------------------


@pytest.mark.allow_log_warnings("moved from", "not reachable now", "writer lease")
def test_prefetch_makes_a_restored_checkpoint_readable_without_the_remote(
    tmp_path: Path, seaweed: SeaweedServer, remote: str
) -> None:
    files = checkpoint()
    with restored_node(tmp_path, remote, files) as m:
        ckpt = m.mountpoint / "ckpt"
        res = run_cli("prefetch", str(ckpt), "--timeout", "60", "--jobs", "2")
        assert res.returncode == 0, res.stdout + res.stderr
        assert "on the local tiers" in res.stdout, res.stdout
        assert local_chunk_keys(m.locals) >= chunk_keys(files)
        assert counter_eventually(m, "copy_backs", len(chunk_keys(files)))
        assert_log_clean(m)
        # Nothing is left to stage: a second prefetch reads nothing and says so.
        again = run_cli("prefetch", str(ckpt), "--timeout", "30")
        assert again.returncode == 0 and "already on the local tiers" in again.stdout, again
        # A fresh mount of the same state dir (cold page cache, cold daemon cache) with the
        # remote down reads everything back bit-identical from the local tiers alone.
        m.stop()
        seaweed.stop(timeout=0.5)  # the filer lingers 15 s on SIGTERM; nothing is lost
        try:
            m.start()
            for name, data in files.items():
                assert read_sequential(m.mountpoint / name, 8 * MiB) == data, name
            n = len(chunk_keys(files))

            def local_reads_counted() -> dict[str, int] | None:
                r = tier_reads(m.state_dir)
                return r if sum(v for k, v in r.items() if k.startswith("local")) >= n else None

            reads = wait_for(local_reads_counted, 30, "stats.json to count the local reads")
            assert reads.get("remote0", 0) == 0, reads
        finally:
            seaweed.start()


@pytest.mark.allow_log_warnings("moved from")
def test_safetensors_with_remote_only_chunks_loads_through_mmap(
    tmp_path: Path, remote: str
) -> None:
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    g = torch.Generator().manual_seed(7)
    tensors = {
        "layer.weight": torch.randn(512, 1024, generator=g),
        "layer.bias": torch.randn(1024, generator=g),
        "embed": torch.randn(300, 700, generator=g).to(torch.bfloat16),
        "tokens": torch.randint(0, 50257, (100_000,), generator=g, dtype=torch.int64),
    }
    staged = tmp_path / "model.safetensors"
    st.save_file(tensors, str(staged))
    blob = staged.read_bytes()
    assert len(blob) > 3 * CHUNK  # several chunks, read through page faults
    with restored_node(tmp_path, remote, {"ckpt/model.safetensors": blob}) as m:
        path = m.mountpoint / "ckpt" / "model.safetensors"
        assert remote_only_chunks(m, [path]) == len(chunk_keys({"x": blob}))
        loaded = st.load_file(str(path))  # safetensors maps the file (mmap)
        assert set(loaded) == set(tensors)
        for name, t in tensors.items():
            assert loaded[name].dtype == t.dtype and torch.equal(loaded[name], t), name
        del loaded  # the tensors keep the file mapped: unmap it before the unmount
        gc.collect()
        reads = wait_for(lambda: tier_reads(m.state_dir).get("remote0", 0), 30,
                         "stats.json to count the remote reads")
        assert reads > 0  # the bytes really came from the remote tier
        assert_log_clean(m)


@pytest.mark.allow_log_warnings("moved from")
def test_sequential_read_of_a_remote_only_file_copies_it_back(
    tmp_path: Path, remote: str
) -> None:
    files = {"ckpt/model.bin": os.urandom(5 * CHUNK + 123)}
    keys = chunk_keys(files)
    with restored_node(tmp_path, remote, files) as m:
        path = m.mountpoint / "ckpt" / "model.bin"
        assert remote_only_chunks(m, [path]) == len(keys)
        assert read_sequential(path) == files["ckpt/model.bin"]
        counter_eventually(m, "copy_backs", len(keys))
        wait_for(lambda: local_chunk_keys(m.locals) >= keys, 30, "the chunks on a local tier")
        # Recorded as valid local replicas, which is what the next read (and prefetch) use.
        wait_for(lambda: remote_only_chunks(m, [path]) == 0, 30, "the local replicas recorded")
        for key in keys:  # each copy is a whole, verified frame
            (copy,) = [t / "chunks" / key[:2] / key for t in m.locals
                       if (t / "chunks" / key[:2] / key).exists()]
            frame.verify(copy.read_bytes(), bytes.fromhex(key))
        assert_log_clean(m)


@pytest.mark.allow_log_errors  # the chunks it cannot read: "no valid copy"
@pytest.mark.allow_log_warnings("moved from", "catalog snapshot upload failed")
def test_prefetch_names_the_file_it_cannot_read(
    tmp_path: Path, seaweed: SeaweedServer, remote: str
) -> None:
    files = {"ckpt/a.bin": os.urandom(2 * CHUNK)}
    with restored_node(tmp_path, remote, files) as m:
        seaweed.stop(timeout=0.5)  # the filer lingers 15 s on SIGTERM; nothing is lost
        try:
            res = run_cli("prefetch", str(m.mountpoint / "ckpt"), "--timeout", "60")
        finally:
            seaweed.start()
        assert res.returncode == 1, res.stdout + res.stderr
        assert "a.bin" in res.stderr and "Input/output error" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr
        # The failed staging is an EIO with a log line, not an unexpected error in the
        # daemon (a nursery's group of ChunkMissing once reached the FUSE boundary).
        assert "unexpected error" not in m.log and "Traceback" not in m.log, m.log[-2000:]


@pytest.mark.allow_log_warnings("is no longer configured")  # node 2 has no local tier
def test_prefetch_reports_local_tiers_without_room(tmp_path: Path, remote: str) -> None:
    """A local tier capped at two chunks: the daemon copies two back and skips the rest;
    prefetch gives up at its timeout, counting the chunks still remote-only."""
    files = {"ckpt/big.bin": os.urandom(5 * CHUNK)}
    tier = tmp_path / "nvme0"
    tier.mkdir()
    cfg = tmp_path / "ckptfs.toml"
    cfg.write_text(
        'chunk_size = "1MiB"\n[[tier]]\nname = "nvme0"\nkind = "local"\n'
        f'path = "{tier}"\ncapacity = "{2 * (CHUNK + frame.HEADER_SIZE)}"\n'
    )
    with restored_node(tmp_path, remote, files, 0, ("--config", str(cfg))) as m:
        res = run_cli("prefetch", str(m.mountpoint / "ckpt"), "--timeout", "4")
        assert res.returncode == 1, res.stdout + res.stderr
        assert "3 of 5 chunk(s) still only on a remote tier" in res.stderr, res.stderr
        assert "big.bin" in res.stderr and "capacity" in res.stderr, res.stderr
        assert len(local_chunk_keys([tier])) == 2
        # Reads are unaffected: the chunks without a local copy come from the remote.
        assert read_sequential(m.mountpoint / "ckpt" / "big.bin") == files["ckpt/big.bin"]
        assert_log_clean(m)


def test_prefetch_outside_a_mount_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "f.bin").write_bytes(b"x")
    res = run_cli("prefetch", str(tmp_path / "plain"))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "is not inside a ckptfs mount" in res.stderr and str(tmp_path / "plain") in res.stderr
    assert "Traceback" not in res.stderr
    res = run_cli("prefetch", str(tmp_path / "missing"))
    assert res.returncode == 2 and "no such file or directory" in res.stderr, res.stderr
    res = run_cli("prefetch", str(tmp_path), "--jobs", "0")
    assert res.returncode == 2 and "--jobs" in res.stderr, res.stderr
    res = run_cli("prefetch")
    assert res.returncode == 2 and "PATH" in res.stderr, res.stderr
