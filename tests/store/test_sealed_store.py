"""Sealed chunks through the daemon's object graph (no FUSE): a file of an encrypted
namespace is stored sealed on the local and the remote tier, read back verified, and a
damaged copy is healed with a sealed frame again, never a plain one; outside the
namespace nothing changes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from tests.store.test_upload import wait_backlog_empty
from tests.vfs.test_vfs import CS, RW, make_fs

from ckptfs.catalog import ROOT_INODE
from ckptfs.codec import frame
from ckptfs.codec.seal import KEYRING, Cipher, SealKey
from ckptfs.config.model import GovernanceConfig, NamespaceConfig
from ckptfs.testing.tiers import MemoryTier
from ckptfs.vfs.context import ROOT

GOV = GovernanceConfig(namespaces=(NamespaceConfig("/sec", uids=(0,), encrypt=True),))
MARK = b"plaintext-marker|"


@pytest.fixture
def key() -> Iterator[SealKey]:
    k = SealKey(1, "/sec", 1, os.urandom(32), os.urandom(32))
    KEYRING.replace([k])
    yield k
    KEYRING.replace([])


async def _write(fs, parent: int, name: bytes, data: bytes) -> list[bytes]:  # type: ignore[no-untyped-def]
    fh, inode = await fs.create(parent, name, 0o644, RW, ROOT)
    for off in range(0, len(data), CS):
        await fs.write(fh, off, data[off : off + CS])
    await fs.flush(fh)
    await fs.release(fh)
    return [r.digest for r in (await fs.db(fs.catalog.extents, inode.ino)).values()]


async def _read(fs, parent: int, name: bytes) -> bytes:  # type: ignore[no-untyped-def]
    inode = await fs.lookup(parent, name)
    fh = await fs.open(inode.ino, os.O_RDONLY)
    try:
        return bytes(await fs.read(fh, 0, inode.size + 10))
    finally:
        await fs.release(fh)


@pytest.mark.allow_log_errors  # the damaged copy is reported
@pytest.mark.allow_log_warnings("healing it")
async def test_an_encrypted_namespace_is_sealed_everywhere_and_healed_sealed(
    tmp_path: Path, key: SealKey,
) -> None:
    local, remote = MemoryTier("l"), MemoryTier("r", kind="remote")
    data = (MARK * (3 * CS // len(MARK) + 1))[: 3 * CS + 99]
    async with make_fs(tmp_path, [local, remote], governance=GOV) as fs:
        sec = await fs.mkdir(ROOT_INODE, b"sec", 0o777, ROOT)
        plain = await fs.mkdir(ROOT_INODE, b"plain", 0o777, ROOT)
        sealed_ids = await _write(fs, sec.ino, b"f", data)
        plain_ids = await _write(fs, plain.ino, b"f", data)
        await wait_backlog_empty(fs)
        assert not set(sealed_ids) & set(plain_ids)
        assert sealed_ids[0] == key.chunk_id([data[:CS]])
        assert plain_ids[0] == frame.digest_of(data[:CS])
        for tier in (local, remote):
            for d in sealed_ids:
                raw = tier.frames[d.hex()]
                assert frame.parse_header(raw).cipher == Cipher.AES256GCM and MARK not in raw
            for d in plain_ids:
                assert frame.parse_header(tier.frames[d.hex()]).cipher == Cipher.NONE
        victim = sealed_ids[1].hex()
        bad = bytearray(local.frames[victim])
        bad[frame.HEADER_SIZE + 7] ^= 0x10
        local.frames[victim] = bytes(bad)
        assert await _read(fs, sec.ino, b"f") == data  # the remote copy, verified
        with trio.fail_after(10):
            while local.frames[victim] == bytes(bad):
                await trio.sleep(0.01)  # polling for the heal, with a deadline
        healed = local.frames[victim]
        assert frame.parse_header(healed).cipher == Cipher.AES256GCM and MARK not in healed
        frame.verify(healed, sealed_ids[1])
        assert await _read(fs, plain.ino, b"f") == data
