"""The read path on real mounts: verified reads, self-healing from a good copy, a lost local
tier, every copy corrupt (EIO naming the file and offset), live statistics in status."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.mount.test_checkpoints import flip_frame, latest_of, missing_chunks, two_checkpoints
from tests.remote.test_remote_mount import MiB, write
from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON, Mount, mounted, run_cli, wait_until
from tests.support.s3server import SeaweedServer

from ckptfs.codec import frame

pytestmark = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)


def frames(tier: Path) -> list[Path]:
    return sorted((tier / "chunks").glob("*/*"))


def flip_byte(path: Path, offset: int = frame.HEADER_SIZE + 100) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x5A]))


def stats(m: Mount) -> dict[str, Any]:
    p = m.state_dir / "stats.json"
    return json.loads(p.read_text()) if p.exists() else {}


def counter(m: Mount, name: str) -> int:
    return int(stats(m).get("counters", {}).get(name, 0))


def frame_ok(path: Path) -> bool:
    try:
        frame.verify(path.read_bytes(), bytes.fromhex(path.name))
        return True
    except Exception:
        return False


@pytest.mark.allow_log_errors
@pytest.mark.allow_log_warnings("corrupt; healing it")
def test_a_flipped_byte_is_served_right_counted_and_repaired(
    tmp_path: Path, remote: tuple[str, str]  # noqa: F811
) -> None:
    url, _ = remote
    data = os.urandom(3 * MiB + 11)
    with mounted(tmp_path, 1, ("--chunk-size", "1MiB", "--remote", url)) as m:
        write(m.mountpoint / "model.pt", data)
        assert run_cli("sync", str(m.mountpoint), "--timeout", "60").returncode == 0
        m.stop()
        victim = next(p for p in frames(m.locals[0]) if p.stat().st_size > MiB)  # a full chunk
        flip_byte(victim)
        assert not frame_ok(victim)
        m.start()  # nothing cached: the read must go to the tiers
        assert (m.mountpoint / "model.pt").read_bytes() == data
        wait_until(lambda: frame_ok(victim))  # rewritten from the remote's good copy
        wait_until(lambda: counter(m, "integrity_failures") >= 1 and counter(m, "heals") >= 1)
        assert "is corrupt" in m.log and "healing it" in m.log
        status = run_cli("status", str(m.mountpoint)).stdout
        assert "integrity_failures 1" in status, status


@pytest.mark.allow_log_errors
@pytest.mark.allow_log_warnings("statfs: tier local0", "cannot sync")  # its directory is gone
def test_a_removed_local_tier_degrades_and_reads_come_from_the_remote(
    tmp_path: Path, remote: tuple[str, str]  # noqa: F811
) -> None:
    url, _ = remote
    data = os.urandom(4 * MiB)
    with mounted(tmp_path, 2, ("--chunk-size", "1MiB", "--remote", url)) as m:
        write(m.mountpoint / "a.bin", data)
        assert run_cli("sync", str(m.mountpoint), "--timeout", "60").returncode == 0
        m.stop()
        m.start()
        assert frames(m.locals[0]), "the checkpoint was striped over both tiers"
        shutil.rmtree(m.locals[0])  # the device is gone while mounted
        assert (m.mountpoint / "a.bin").read_bytes() == data
        wait_until(lambda: any(
            t["name"] == "local0" and t["state"] == "degraded" for t in stats(m).get("tiers", [])
        ))
        status = run_cli("status", str(m.mountpoint)).stdout
        assert "local0" in status and "degraded" in status, status
        order = stats(m)["read_order_16mib"]
        assert order[-1] == "local0", order  # a degraded tier is read last
        new = os.urandom(2 * MiB)
        write(m.mountpoint / "b.bin", new)  # new writes avoid the lost tier
        assert (m.mountpoint / "b.bin").read_bytes() == new
        assert not m.locals[0].exists()


@pytest.mark.allow_log_errors
def test_every_copy_corrupt_gives_eio_naming_file_and_offset(tmp_path: Path) -> None:
    data = os.urandom(2 * MiB + 5)
    with mounted(tmp_path, 1, ("--chunk-size", "1MiB")) as m:
        write(m.mountpoint / "ckpt.pt", data)
        m.stop()
        names = {p.name: p for p in frames(m.locals[0])}
        second = frame.digest_of(data[MiB : 2 * MiB]).hex()
        flip_byte(names[second])
        m.start()
        with open(m.mountpoint / "ckpt.pt", "rb") as f:
            assert f.read(MiB) == data[:MiB]  # the intact chunk reads fine
            with pytest.raises(OSError) as exc:
                f.seek(MiB)
                f.read(MiB)
        assert exc.value.errno == errno.EIO
        assert f"read of /ckpt.pt at offset {MiB} (chunk 1) failed" in m.log
        wait_until(lambda: counter(m, "integrity_failures") >= 1)


@pytest.mark.allow_log_errors  # the reads of the damaged chunk
def test_a_chunk_corrupt_on_the_local_tier_and_in_the_bucket_takes_the_checkpoint_out_of_latest(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str]  # noqa: F811
) -> None:
    """Issue 33, item 6: both copies of one chunk of checkpoint-1100 damaged; the read
    that finds them so records them bad, and ``ckptfs latest`` names checkpoint-1000."""
    url, prefix = remote
    with mounted(tmp_path, 1, ("--chunk-size", "1MiB", "--remote", url)) as m:
        run = m.mountpoint / "run"
        payload = two_checkpoints(run)
        assert run_cli("sync", str(m.mountpoint), "--timeout", "60").returncode == 0
        m.stop()
        digest = frame.digest_of(payload[:MiB])
        flip_frame(m.locals[0], digest)
        key = f"{prefix}/chunks/{digest.hex()}"
        client = seaweed.client()
        try:
            body = bytearray(client.get_object(Bucket=seaweed.bucket, Key=key)["Body"].read())
            body[frame.HEADER_SIZE + 10] ^= 1
            client.put_object(Bucket=seaweed.bucket, Key=key, Body=bytes(body))
        finally:
            client.close()
        m.start()
        with pytest.raises(OSError) as exc:
            (run / "checkpoint-1100" / "model.safetensors").read_bytes()
        assert exc.value.errno == errno.EIO
        assert latest_of(run) == str(run / "checkpoint-1000")
        assert missing_chunks(run, "/run/checkpoint-1100") == 1
        assert missing_chunks(run, "/run/checkpoint-1000") == 0
