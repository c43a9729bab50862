"""The Tier conformance suite (tier_conformance.py) on the local and memory tiers, plus
what only tiers with a capacity or a directory can show."""

import ctypes
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.tier_conformance import TierConformance, framed

from ckptfs.chunks.bufpool import FrameBuffer, FramePool
from ckptfs.codec import frame
from ckptfs.codec.staged import StagePool
from ckptfs.config import TierConfig
from ckptfs.errors import CorruptChunk, NoSpace, TierError
from ckptfs.testing.tiers import MemoryTier
from ckptfs.tiers import direct, local
from ckptfs.tiers.base import Tier
from ckptfs.tiers.local import LocalTier


@pytest.fixture(params=["local", "local-buffered", "local-device", "memory"])
def tier(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Tier]:
    cap = 8 << 20
    if request.param == "memory":
        yield MemoryTier("t", capacity=cap)
        return
    t = LocalTier(TierConfig(
        "t", "local", tmp_path / "tier", capacity=cap,
        direct_io=request.param != "local-buffered",
        verify_writes="device" if request.param == "local-device" else "memory",
    ))
    t.open()
    assert t.verified_put  # every local put checks its frame (O_DIRECT or read back)
    assert t._direct == (request.param != "local-buffered")  # /tmp takes O_DIRECT here
    yield t


class TestConformance(TierConformance):
    pass


def test_capacity_gives_nospace(tier: Tier) -> None:
    key, parts = framed(b"x" * (7 << 20))
    tier.put(key, parts)
    key2, parts2 = framed(b"y" * (2 << 20))
    with pytest.raises(NoSpace):
        tier.put(key2, parts2)
    assert tier.get(key2) is None
    assert frame.decode(tier.get(key) or b"") == b"x" * (7 << 20)


def test_direct_put_leaves_no_temp_file_and_exact_size(tmp_path: Path) -> None:
    t = LocalTier(TierConfig("t", "local", tmp_path / "t"))
    t.open()
    data = os.urandom(2 * 1024 * 1024 + 123)
    key, parts = framed(data)
    t.put(key, parts)
    stored = tmp_path / "t" / "chunks" / key[:2] / key
    assert stored.stat().st_size == frame.HEADER_SIZE + len(data)  # the padding is cut off
    assert list((tmp_path / "t" / "tmp").iterdir()) == []
    assert t.usage().used == frame.HEADER_SIZE + len(data)


@pytest.mark.parametrize("verify", ["memory", "device"])
@pytest.mark.parametrize("tail", [0, 1, 123, 4095])
def test_direct_put_writes_the_exact_frame_without_a_truncate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verify: str, tail: int
) -> None:
    """The whole blocks go with O_DIRECT, the last partial block through the page cache:
    no padded write cut back by ftruncate (which made ext4 read the cut block back and
    wait on its journal). The frame reads back exactly, after the page cache is dropped
    for the file too."""
    t = LocalTier(TierConfig("t", "local", tmp_path / "t", verify_writes=verify))  # type: ignore[arg-type]
    t.open()
    assert t.verified_put
    # frame = header + data; make the frame end ``tail`` bytes into its last block
    data = os.urandom(2 * 1024 * 1024 - frame.HEADER_SIZE + tail)
    key, parts = framed(data)

    def no_truncate(*args: object) -> None:
        raise AssertionError("ftruncate called")

    monkeypatch.setattr(os, "ftruncate", no_truncate)
    t.put(key, parts)
    stored = tmp_path / "t" / "chunks" / key[:2] / key
    assert stored.stat().st_size == frame.HEADER_SIZE + len(data)
    fd = os.open(stored, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    assert stored.read_bytes() == b"".join(bytes(p) for p in parts)
    assert bytes(frame.decode(t.get(key) or b"")) == data


@pytest.mark.parametrize("verify", ["memory", "device"])
@pytest.mark.parametrize("size", [2 * 1024 * 1024, 5 * 1024 * 1024 + 77, 300_000])
def test_staged_frame_goes_to_the_device_from_its_own_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verify: str, size: int
) -> None:
    """A chunk staged in place (codec/staged.py) is handed over as one page-aligned frame:
    a large one is written with O_DIRECT from that buffer, with no copy into another one
    (and so nothing to compare); with verify_writes = "device" it is still read back into
    a buffer of the tier's and compared. A small one is written buffered and read back."""
    t = LocalTier(TierConfig("t", "local", tmp_path / "t", verify_writes=verify))  # type: ignore[arg-type]
    t.open()
    data = os.urandom(size)
    staged = StagePool(chunk_size=8 * 1024 * 1024, keep=1).take()
    staged.write(0, data)
    digest = frame.digest_of_parts([staged.body()])
    key = digest.hex()
    copies: list[int] = []
    real_copy = direct._copy

    def counting_copy(base: int, at: int, part: frame.Buffer, view: memoryview) -> None:
        copies.append(len(part))
        real_copy(base, at, part, view)

    monkeypatch.setattr(direct, "_copy", counting_copy)
    t.put(key, [staged.frame(digest)])
    assert copies == []
    stored = tmp_path / "t" / "chunks" / key[:2] / key
    assert stored.stat().st_size == frame.HEADER_SIZE + size
    fd = os.open(stored, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    assert bytes(frame.decode(t.get(key) or b"", digest)) == data
    assert list((tmp_path / "t" / "tmp").iterdir()) == []


def test_staged_frame_that_differs_on_the_device_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verify_writes = "device" compares the staged frame with what the device returns."""
    t = LocalTier(TierConfig("t", "local", tmp_path / "t", verify_writes="device"))
    t.open()
    staged = StagePool(chunk_size=4 * 1024 * 1024, keep=1).take()
    staged.write(0, os.urandom(3 * 1024 * 1024))
    digest = frame.digest_of_parts([staged.body()])
    real_preadv = os.preadv

    def flipping_preadv(fd: int, buffers: list[memoryview], offset: int) -> int:
        n = real_preadv(fd, buffers, offset)
        buffers[0][100] ^= 1  # the device returned a flipped bit
        return n

    monkeypatch.setattr(os, "preadv", flipping_preadv)
    with pytest.raises(CorruptChunk):
        t.put(digest.hex(), [staged.frame(digest)])
    assert not t.has(digest.hex())


def test_small_put_names_the_frame_by_one_link_and_leaves_nothing_when_it_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = LocalTier(TierConfig("t", "local", tmp_path / "t"))
    t.open()
    key, parts = framed(os.urandom(4096))
    real_link = os.link

    def failing_link(*args: object, **kw: object) -> None:
        raise OSError(5, "Input/output error")  # as a crash between the write and the name

    monkeypatch.setattr(os, "link", failing_link)
    with pytest.raises(TierError):
        t.put(key, parts)
    assert not t.has(key)
    assert list((tmp_path / "t" / "tmp").iterdir()) == []  # an unnamed file: nothing left
    assert t.usage().used == 0
    monkeypatch.setattr(os, "link", real_link)
    size = t.put(key, parts)
    assert t.get(key) == b"".join(bytes(p) for p in parts)
    assert t.put(key, parts) == size  # the key exists: rewritten by rename, counted once
    assert t.usage().used == size and list((tmp_path / "t" / "tmp").iterdir()) == []


def test_small_puts_of_one_key_at_once_into_a_new_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two puts of the same bytes race (identical chunks of one file): the other one makes
    # the chunk directory and links the key between this one's two link attempts.
    t = LocalTier(TierConfig("t", "local", tmp_path / "t"))
    t.open()
    key, parts = framed(os.urandom(4096))
    final = tmp_path / "t" / "chunks" / key[:2] / key
    real_link = os.link
    calls = 0

    def racing_link(src: str, dst: object, **kw: object) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise FileNotFoundError(2, "No such file or directory")
        if calls == 2:
            final.write_bytes(b"".join(bytes(p) for p in parts))  # the other put's frame
        real_link(src, dst, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "link", racing_link)
    size = t.put(key, parts)
    assert t.get(key) == b"".join(bytes(p) for p in parts)
    assert size == final.stat().st_size


def test_small_put_renames_where_the_filesystem_has_no_o_tmpfile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = LocalTier(TierConfig("t", "local", tmp_path / "t"))
    t.open()
    real_open = os.open

    def no_tmpfile(path: object, flags: int, *args: object, **kw: object) -> int:
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            raise OSError(95, "Operation not supported")
        return real_open(path, flags, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", no_tmpfile)
    for _ in range(2):
        key, parts = framed(os.urandom(4096))
        t.put(key, parts)
        assert t.get(key) == b"".join(bytes(p) for p in parts)
    assert list((tmp_path / "t" / "tmp").iterdir()) == []


def test_direct_compare_finds_a_difference() -> None:
    pool = direct.BufferPool()
    buf = pool.take(8192)
    buf[:4] = b"abcd"
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    direct._compare(base, [b"ab", bytearray(b"cd")], "buffer")
    with pytest.raises(CorruptChunk, match="at offset 2"):
        direct._compare(base, [b"ab", memoryview(b"cX")], "buffer")
    pool.give(buf)


def test_direct_io_falls_back_where_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert direct.supported(str(tmp_path))
    # A filesystem that refuses O_DIRECT (older tmpfs, some FUSE and overlay setups):
    # buffered writes, each read back and compared by the put itself.
    monkeypatch.setattr(direct, "supported", lambda directory: False)
    t = LocalTier(TierConfig("t", "local", tmp_path / "t"))
    t.open()
    assert t.verified_put and not t._direct
    key, parts = framed(os.urandom(2 << 20))
    t.put(key, parts)
    t.verify(key, bytes.fromhex(key))
    with pytest.raises(TierError, match="refuses"):
        LocalTier(TierConfig("u", "local", tmp_path / "u", verify_writes="device")).open()


def test_device_verification_needs_direct_io(tmp_path: Path) -> None:
    cfg = TierConfig("t", "local", tmp_path / "t", direct_io=False, verify_writes="device")
    with pytest.raises(TierError, match="direct_io = false"):
        LocalTier(cfg).open()


def test_local_tier_reports_vanished_directory(tmp_path: Path) -> None:
    t = LocalTier(TierConfig("gone", "local", tmp_path / "gone"))
    t.open()
    key, parts = framed(b"data")
    t.put(key, parts)
    shutil.rmtree(tmp_path / "gone")
    with pytest.raises(TierError, match="gone"):
        t.get(key)
    with pytest.raises(TierError):
        t.put(key, parts)
    with pytest.raises(TierError):
        t.check()


def test_local_tier_open_removes_leftover_temp_files(tmp_path: Path) -> None:
    cfg = TierConfig("t", "local", tmp_path / "t")
    LocalTier(cfg).open()
    (tmp_path / "t" / "tmp" / "half-written").write_bytes(b"partial")
    t = LocalTier(cfg)
    t.open()
    assert list((tmp_path / "t" / "tmp").iterdir()) == []


@pytest.mark.parametrize("size", [4096, 2 << 20])
def test_buffered_put_reads_the_frame_back_and_compares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """With ``direct_io = false`` the put itself reads the frame back from the page cache
    and compares it with the parts (memcmp; no second blake3 pass in a separate verify):
    a frame that went wrong on the way in is refused and leaves nothing."""
    t = LocalTier(TierConfig("t", "local", tmp_path / "t", direct_io=False))
    t.open()
    key, parts = framed(os.urandom(size))
    real = local._write_all

    def flip_one_byte(fd: int, ps: object, n: int) -> None:
        joined = bytearray(b"".join(bytes(p) for p in parts))
        joined[n // 2] ^= 1
        real(fd, [bytes(joined)], n)

    monkeypatch.setattr(local, "_write_all", flip_one_byte)
    with pytest.raises(CorruptChunk, match="read back"):
        t.put(key, parts)
    assert not t.has(key)
    assert list((tmp_path / "t" / "tmp").iterdir()) == []
    monkeypatch.setattr(local, "_write_all", real)
    t.put(key, parts)
    assert bytes(frame.decode(t.get(key) or b"")) == b"".join(bytes(p) for p in parts)[frame.HEADER_SIZE:]


@pytest.mark.parametrize("direct_io", [True, False])
def test_get_into_reads_a_large_frame_into_the_buffer_given(tmp_path: Path, direct_io: bool) -> None:
    """A local read of a large frame lands in the caller's reused buffer (the store's
    FramePool: no new bytearray zeroed per chunk), with O_DIRECT or without; small frames
    and a ``take`` that gives nothing are read as ``get`` reads them."""
    t = LocalTier(TierConfig("t", "local", tmp_path / "t", direct_io=direct_io))
    t.open()
    data = os.urandom(3 * 1024 * 1024 + 77)
    key, parts = framed(data)
    t.put(key, parts)
    pool = FramePool(keep=2)
    asked: list[int] = []

    def take(n: int) -> FrameBuffer | None:
        asked.append(n)
        return pool.take(n)

    got = t.get_into(key, take)
    assert got is not None and frame.decode(got, bytes.fromhex(key)) == data
    # With O_DIRECT or without (a buffered tier reads into the reused buffer too).
    assert isinstance(got, memoryview) and isinstance(got.obj, FrameBuffer)
    assert asked == [direct.aligned_size(frame.HEADER_SIZE + len(data))]
    buf = got.obj
    del got
    pool.give(buf)
    again = t.get_into(key, pool.take)  # the same buffer, reused
    assert isinstance(again, memoryview) and again.obj is buf and pool.reused == 1
    assert bytes(again) == bytes(t.get(key) or b"")
    assert t.get_into(key, lambda n: None) == t.get(key)  # no buffer: read as get does
    small_key, small_parts = framed(b"s" * 1000)
    t.put(small_key, small_parts)
    assert frame.decode(t.get_into(small_key, take) or b"") == b"s" * 1000
    assert t.get_into("ab" * 32, take) is None
