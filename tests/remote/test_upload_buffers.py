"""The upload reads each frame from its local tier into a reused buffer, checks it, and
sends that buffer itself to the bucket (no copy): a damaged local frame is still never
uploaded, and what lands in the bucket is the verified frame."""

import os
import time
from pathlib import Path

import pytest
import trio

from tests.store.test_upload import skip_backoff
from tests.vfs.test_vfs import catalog_of, make_fs, uploader_of, write_file

from ckptfs.codec import frame
from ckptfs.config import TierConfig, UploadConfig
from ckptfs.testing.tiers import FaultyTier
from ckptfs.tiers.local import LocalTier
from ckptfs.tiers.s3 import S3Tier

CHUNK = 2 * 1024 * 1024


def _flip_a_bit(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))


@pytest.mark.allow_log_errors("has no valid local copy to upload")
@pytest.mark.allow_log_warnings("will retry with backoff", "catalog snapshot upload failed")
async def test_uploads_reuse_their_read_buffers_and_never_send_a_damaged_frame(
    tmp_path: Path, s3_tier: S3Tier
) -> None:
    local = LocalTier(TierConfig("l", "local", tmp_path / "l", create=True))
    local.open()
    remote = FaultyTier(s3_tier)
    remote.kind = "remote"
    remote.fail_puts = True  # hold the uploads until a local frame is damaged
    async with make_fs(tmp_path, [local, remote], chunk_size=CHUNK, memory_budget=8 * CHUNK,
                       upload=UploadConfig(concurrency=1, during_save="overlap")) as fs:
        await write_file(fs, b"a", os.urandom(2 * CHUNK), step=CHUNK // 4)
        with trio.fail_after(20):
            while (await fs.db(catalog_of(fs).backlog)).last_error is None:
                await trio.sleep(0.01)  # polling the catalog for the condition
        bad, good = sorted(local.list_keys())
        _flip_a_bit(local._path(bad), CHUNK // 2)  # on the local device, after its commit
        up = uploader_of(fs)
        remote.fail_puts = False
        up.clock = skip_backoff
        up.kick()
        # Until the good one is sent and the damaged one was tried (on this clock) and
        # blocked: tried later, on the real clock, its read would take a buffer below.
        with trio.fail_after(30):
            while not s3_tier.has(good) or (
                    (b := await fs.db(catalog_of(fs).backlog)).chunks, b.blocked) != (1, 1):
                await trio.sleep(0.01)  # polling the bucket and the catalog
        assert not s3_tier.has(bad)  # its only copy is damaged: it stays local, unsent
        up.clock = time.time_ns  # the damaged one waits out its long retry

        # Uploads that succeed, one at a time: one buffer, read into again for each frame
        # ("overlap": no upload waits for the writes as for a save, which would leave the
        # queue idle meanwhile, and an idle queue lets its buffers go).
        made, reused = up.frames.made, up.frames.reused
        await write_file(fs, b"b", os.urandom(3 * CHUNK), step=CHUNK // 4)
        with trio.fail_after(30):
            while (await fs.db(catalog_of(fs).backlog)).chunks != 1:
                await trio.sleep(0.01)
        assert up.frames.made - made == 1
        assert up.frames.reused - reused == 2
        uploaded = set(local.list_keys()) - {bad}
    assert len(uploaded) == 4
    for key in uploaded:
        raw = s3_tier.get(key)
        assert raw is not None
        frame.verify(raw, bytes.fromhex(key))
