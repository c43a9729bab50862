"""A node written by an older ckptfs (tests/data/previous-version.tar.gz, made by
scripts/make_previous_version_fixture.py from the commit its manifest names) mounts and reads
as before: its state dir and local tiers on the same node, and its bucket alone on a new node.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON, Mount, mounted, run_cli
from tests.support.s3fixtures import remove_prefix
from tests.support.s3server import ACCESS_KEY, SECRET_KEY, SeaweedServer

pytestmark = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)

ARCHIVE = Path(__file__).resolve().parents[1] / "data" / "previous-version.tar.gz"


@pytest.fixture
def old_node(tmp_path: Path, seaweed: SeaweedServer,
             monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str, dict[str, Any]]]:
    """The unpacked node (state/, tier0/, tier1/), a remote URL whose prefix holds the old
    bucket objects, and the manifest of what the old version wrote."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    node = tmp_path / "old"
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(node, filter="data")
    manifest = json.loads((node / "manifest.json").read_text())
    prefix = f"prev-{uuid.uuid4().hex[:10]}"
    client = seaweed.client()
    for p in sorted((node / "bucket").rglob("*")):
        if p.is_file():
            key = f"{prefix}/{p.relative_to(node / 'bucket')}"
            client.put_object(Bucket=seaweed.bucket, Key=key, Body=p.read_bytes())
    client.close()
    try:
        yield node, f"s3://{seaweed.bucket}/{prefix}?endpoint={seaweed.endpoint}", manifest
    finally:
        remove_prefix(seaweed, seaweed.bucket, prefix)


def assert_reads_as_written(mnt: Path, manifest: dict[str, Any]) -> None:
    for rel, want in manifest["files"].items():
        p = mnt / rel
        st = os.lstat(p)
        assert st.st_mode == want["mode"], rel
        if "symlink" in want:
            assert os.readlink(p) == want["symlink"], rel
        elif "sha256" in want:
            assert hashlib.sha256(p.read_bytes()).hexdigest() == want["sha256"], rel
            assert (st.st_size, st.st_nlink, st.st_mtime_ns) == (
                want["size"], want["nlink"], want["mtime_ns"]), rel
            for name, value in want["xattrs"].items():
                assert os.getxattr(p, name).decode() == value, (rel, name)


def same_checkpoints(m: Mount, manifest: dict[str, Any]) -> None:
    res = run_cli("ls", str(m.mountpoint / "run"), "--json")
    assert res.returncode == 0, res.stderr
    keys = ("root", "framework", "step", "state", "files", "logical_bytes", "durable_on",
            "missing_chunks", "reason")
    got = [{k: c[k] for k in keys} for c in json.loads(res.stdout)]
    assert got == [{k: c[k] for k in keys} for c in manifest["checkpoints"]]


# The tiers were made at other paths on the old machine.
@pytest.mark.allow_log_warnings("moved from")
def test_the_old_state_dir_and_tiers_mount_read_and_take_new_writes(
        old_node: tuple[Path, str, dict[str, Any]]) -> None:
    node, url, manifest = old_node
    m = Mount(node / "mnt", node / "state", [node / "tier0", node / "tier1"],
              ("--remote", url, "--chunk-size", str(manifest["chunk_size"])))
    try:
        m.start()
        assert_reads_as_written(m.mountpoint, manifest)
        same_checkpoints(m, manifest)
        res = run_cli("verify", str(m.mountpoint / "run" / "checkpoint-5"))
        assert res.returncode == 0, res.stdout + res.stderr
        new = m.mountpoint / "run" / "after-upgrade.bin"
        data = os.urandom(300 * 1024)
        new.write_bytes(data)
        m.stop()
        m.start()  # the migrated state dir mounts again, old and new files intact
        assert new.read_bytes() == data
        assert_reads_as_written(m.mountpoint, manifest)
        m.stop()
    finally:
        m.cleanup()


@pytest.mark.allow_log_warnings("moved from", "is no longer configured")
def test_a_new_node_restores_the_old_bucket_alone(
        tmp_path: Path, old_node: tuple[Path, str, dict[str, Any]]) -> None:
    _node, url, manifest = old_node
    with mounted(tmp_path / "new", 1,
                 ("--remote", url, "--chunk-size", str(manifest["chunk_size"]))) as m:
        assert "restored the catalog" in m.log
        same_checkpoints(m, manifest)  # before the reads copy chunks back to local0
        assert_reads_as_written(m.mountpoint, manifest)
