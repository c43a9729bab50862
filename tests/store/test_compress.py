"""lz4 for the remote copy of a chunk: the per-chunk decision, the round trip, the fallback
when the compressed frame does not verify, the config key, and one real upload to
SeaweedFS read back through ckptfs from the remote alone."""

from __future__ import annotations

import os
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from tests.store.test_upload import wait_backlog_empty
from tests.vfs.test_vfs import make_fs, read_file, uploader_of, write_file

from ckptfs import config
from ckptfs.codec import compress, frame
from ckptfs.codec.compress import MAX_RATIO, Estimate, RemoteCompressor, remote_frame, worth_it
from ckptfs.codec.frame import Codec
from ckptfs.config import config_from_dict
from ckptfs.errors import ConfigError, CorruptChunk
from ckptfs.testing.tiers import MemoryTier
from ckptfs.tiers.base import Tier
from ckptfs.tiers.s3 import S3Tier
from ckptfs.vfs.filesystem import Filesystem

MiB = 1 << 20


def raw_frame(plain: bytes) -> tuple[bytes, bytes]:
    digest = frame.digest_of(plain)
    return b"".join(bytes(p) for p in frame.encode([plain], digest)), digest


def repetitive(n: int) -> bytes:
    """A 4 KiB random block over and over: lz4 finds the repeats (its window is 64 KiB)."""
    block = os.urandom(4096)
    return (block * (n // 4096 + 1))[:n]


def mixed(n: int, random_share: float, seed: int = 1) -> bytes:
    """Runs of random bytes and zeros, ``random_share`` of them random: a chosen ratio."""
    rnd = random.Random(seed)
    out = bytearray()
    while len(out) < n:
        out += rnd.randbytes(int(1024 * random_share)) + bytes(1024 - int(1024 * random_share))
    return bytes(out[:n])


def check_lz4(sent: frame.Buffer, plain: bytes, digest: bytes) -> None:
    assert frame.parse_header(sent).codec == Codec.LZ4
    frame.verify(sent, digest)
    assert frame.decode(sent, digest) == plain


# --------------------------------------------------------------------------- frame


def test_encode_lz4_round_trips_and_is_checked() -> None:
    import lz4.block

    plain = repetitive(300_000)
    digest = frame.digest_of(plain)
    packed = frame.encode_lz4(lz4.block.compress(plain, store_size=False), len(plain), digest)
    header = frame.parse_header(packed)
    assert (header.codec, header.plain_len, header.digest) == (Codec.LZ4, len(plain), digest)
    assert header.body_len == len(packed) - frame.HEADER_SIZE < len(plain)
    assert frame.decode(packed, digest) == plain
    with pytest.raises(CorruptChunk):
        frame.verify(packed, frame.digest_of(b"something else"))
    bad = bytearray(packed)
    bad[-1] ^= 0xFF
    with pytest.raises(CorruptChunk):
        frame.verify(bytes(bad), digest)


# --------------------------------------------------------------------------- decision


def test_random_bytes_stay_raw() -> None:
    plain = os.urandom(MiB)
    raw, digest = raw_frame(plain)
    sent, choice = remote_frame(raw, digest)
    assert sent is raw
    assert (choice.codec, choice.sent_len, choice.saved) == (Codec.RAW, len(raw), 0)
    assert "sample ratio" in choice.reason


@pytest.mark.parametrize(
    "make", [lambda n: bytes(n), repetitive, lambda n: mixed(n, 0.5)],
    ids=["zeros", "repetitive", "half-zeros"],
)
@pytest.mark.parametrize("size", [100_000, MiB + 12_345])  # whole-sample path, sampled path
def test_compressible_data_goes_as_verified_lz4(make: Callable[[int], bytes], size: int) -> None:
    plain = make(size)
    raw, digest = raw_frame(plain)
    sent, choice = remote_frame(raw, digest)
    check_lz4(sent, plain, digest)
    assert choice.codec == Codec.LZ4
    assert choice.sent_len == len(sent) < MAX_RATIO * len(raw)
    assert choice.saved == len(raw) - len(sent) > 0


def test_off_never_compresses_and_always_compresses_whenever_smaller() -> None:
    plain = mixed(MiB, 0.96)  # compressible, but not enough for "auto"
    raw, digest = raw_frame(plain)
    _, auto = remote_frame(raw, digest, "auto")
    assert auto.codec == Codec.RAW
    sent, always = remote_frame(raw, digest, "always")
    check_lz4(sent, plain, digest)
    assert MAX_RATIO * len(raw) < always.sent_len < len(raw)
    zeros, zdigest = raw_frame(bytes(MiB))
    sent, off = remote_frame(zeros, zdigest, "off")
    assert sent is zeros and off.codec == Codec.RAW
    noise, ndigest = raw_frame(os.urandom(MiB))
    sent, always = remote_frame(noise, ndigest, "always")  # lz4 output would be larger
    assert sent is noise and always.codec == Codec.RAW
    with pytest.raises(ValueError, match="mode"):
        remote_frame(raw, digest, "sometimes")


def test_network_rate_decides_when_cpu_costs_more_than_the_wire_saves() -> None:
    plain = mixed(4 * MiB, 0.5)
    raw, digest = raw_frame(plain)
    sent, slow = remote_frame(raw, digest, network_rate=1e6)  # 1 MB/s: compressing pays
    assert slow.codec == Codec.LZ4, slow.reason
    check_lz4(sent, plain, digest)
    sent, fast = remote_frame(raw, digest, network_rate=1e15)  # wire costs ~nothing
    assert sent is raw and fast.codec == Codec.RAW and "costs" in fast.reason


def test_worth_it_arithmetic() -> None:
    # Compress + verify at 1 GB/s, half the bytes saved: pays below a 0.5 GB/s network.
    est = Estimate(ratio=0.5, cost_s_per_byte=1e-9, sampled=4 * 65536, whole=None)
    n = 16 * MiB
    assert worth_it(est, n, None)[0]  # unknown rate: the ratio alone decides
    assert worth_it(est, n, 0.4e9)[0]
    assert not worth_it(est, n, 0.6e9)[0]
    poor = Estimate(ratio=MAX_RATIO, cost_s_per_byte=1e-12, sampled=4 * 65536, whole=None)
    assert not worth_it(poor, n, None)[0] and not worth_it(poor, n, 1.0)[0]
    # Fresh memory at 1 ns/byte for plain + compressed (1.5 n) tips 0.4 GB/s over.
    assert est.cpu_s(n, 1e-9) == pytest.approx(n * 1e-9 + 1.5 * n * 1e-9)
    assert not worth_it(est, n, 0.4e9, memory_s_per_byte=1e-9)[0]
    assert worth_it(est, n, 0.15e9, memory_s_per_byte=1e-9)[0]


def test_sample_cost_is_small_and_spread_out() -> None:
    plain = bytes(16 * MiB)
    est = compress.estimate(plain)
    assert est.sampled == compress.SAMPLES * compress.SAMPLE_SIZE
    assert est.whole is None and est.ratio < 0.01
    # A chunk that is random except for a zero tail: the last sample sees the tail.
    tail = os.urandom(15 * MiB) + bytes(MiB)
    assert 0.7 < compress.estimate(tail).ratio < 0.8


# --------------------------------------------------------------------------- fallback


@pytest.mark.parametrize("mode", ["auto", "always"])
@pytest.mark.allow_log_errors
def test_a_compressed_frame_that_does_not_verify_is_never_returned(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, mode: str
) -> None:
    real = compress._lz4_compress
    plain = bytes(MiB)
    other = real(b"\x01" * MiB)  # valid lz4 of the same length: only the digest catches it

    for garbage in (b"\x00" * 16, other):
        # The sample still sees a healthy compressor; the whole chunk gets garbage.
        monkeypatch.setattr(
            compress, "_lz4_compress",
            lambda d, g=garbage: real(d) if len(d) <= compress.SAMPLE_SIZE else g,
        )
        raw, digest = raw_frame(plain)
        caplog.clear()
        sent, choice = remote_frame(raw, digest, mode)
        assert sent is raw and choice.codec == Codec.RAW
        assert choice.reason == "lz4 frame failed verification"
        assert "failed verification" in caplog.text


@pytest.mark.allow_log_errors
def test_a_broken_sample_keeps_the_chunk_raw(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(compress, "_lz4_compress", lambda d: b"\x00" * 16)
    raw, digest = raw_frame(bytes(MiB))
    sent, choice = remote_frame(raw, digest)
    assert sent is raw and choice.codec == Codec.RAW
    assert "lz4 sample failed" in caplog.text


# --------------------------------------------------------------------------- state, config


def test_compressor_counts_and_estimates_the_rate() -> None:
    c = RemoteCompressor("auto")
    assert c.network_rate is None
    zeros, zd = raw_frame(bytes(2 * MiB))
    sent, choice = c.frame_for(zeros, zd)
    c.sent(choice, 0.001)  # a small put: no rate sample
    assert (c.chunks_lz4, c.bytes_saved, c.network_rate) == (1, choice.saved, None)
    noise, nd = raw_frame(os.urandom(2 * MiB))
    _, choice = c.frame_for(noise, nd)
    c.sent(choice, 0.01)
    assert c.chunks_raw == 1 and c.network_rate == pytest.approx(len(noise) / 0.01)
    c.sent(choice, 0.02)
    assert c.network_rate == pytest.approx(len(noise) / 0.01 * 0.7 + len(noise) / 0.02 * 0.3)
    with pytest.raises(ValueError):
        RemoteCompressor("lz4")


def test_compressor_learns_the_cost_of_fresh_memory() -> None:
    c = RemoteCompressor("auto")
    plain = bytes(2 * MiB)
    raw, digest = raw_frame(plain)
    _, choice = c.frame_for(raw, digest)
    assert choice.codec == Codec.LZ4 and choice.whole_s is not None
    assert choice.sample_est_s is not None and c.memory_s_per_byte >= 0.0
    fresh = RemoteCompressor("auto")
    fresh.learn(whole_s=0.030, sample_est_s=0.010, fresh_bytes=10_000_000)  # the first sets it
    assert fresh.memory_s_per_byte == pytest.approx(2e-9)
    fresh.learn(whole_s=0.010, sample_est_s=0.020, fresh_bytes=10_000_000)  # never negative
    assert fresh.memory_s_per_byte == pytest.approx(2e-9 * 0.7)
    # A learned cost that dwarfs the saving keeps compressible chunks raw.
    c.network_rate, c.memory_s_per_byte = 1e9, 1e-6
    _, choice = c.frame_for(raw, digest)
    assert choice.codec == Codec.RAW and "costs" in choice.reason
    # ... except every PROBE_EVERY-th chunk, decided on its ratio and measured again.
    codecs = [c.frame_for(raw, digest)[1].codec for _ in range(2 * compress.PROBE_EVERY)]
    assert codecs.count(Codec.LZ4) == 2
    assert c.memory_s_per_byte < 1e-6  # learned from the probes


def test_config_key() -> None:
    assert config_from_dict({}).upload.compression == "auto"
    for mode in ("auto", "off", "always"):
        assert config_from_dict({"remote_compression": mode}).upload.compression == mode
    for bad in ("lz4", "", True, 1):
        with pytest.raises(ConfigError, match=r"^remote_compression: expected one of"):
            config_from_dict({"remote_compression": bad})


# --------------------------------------------------------------------------- uploads


@pytest.mark.allow_log_warnings("copy on tier l missing; healing it")
async def test_uploader_sends_lz4_and_keeps_local_frames_raw(tmp_path: Path) -> None:
    local, remote = MemoryTier("l"), MemoryTier("r", kind="remote")
    data = bytes(100_000) + os.urandom(100_000)  # 64 KiB chunks: zeros, mixed, random
    async with make_fs(tmp_path, [local, remote]) as fs:
        await write_file(fs, b"f", data)
        await wait_backlog_empty(fs)
        assert uploader_of(fs).compressor.chunks_lz4 >= 1 and uploader_of(fs).compressor.chunks_raw >= 1
    assert set(remote.frames) == set(local.frames)
    codecs = set()
    for key, sent in remote.frames.items():
        assert frame.parse_header(local.frames[key]).codec == Codec.RAW
        codecs.add(frame.parse_header(sent).codec)
        frame.verify(sent, bytes.fromhex(key))
    assert codecs == {Codec.RAW, Codec.LZ4}
    local.frames.clear()  # reads now come from the remote copies
    async with make_fs(tmp_path, [local, remote]) as fs:
        assert await read_file(fs, b"f") == data


@asynccontextmanager
async def fs_on(path: Path, tiers: list[Tier], chunk_size: int) -> AsyncIterator[Filesystem]:
    async with make_fs(path, tiers, chunk_size=chunk_size, memory_budget=8 * chunk_size) as fs:
        yield fs


async def test_real_s3_holds_a_smaller_lz4_frame_and_reads_back_exact(
    tmp_path: Path, s3_tier_factory: Callable[..., S3Tier]  # noqa: F811
) -> None:
    s3 = s3_tier_factory()
    # One compressible 1 MiB chunk (sampled path), then a short random one. Both puts are
    # below RATE_MIN_BYTES, so no rate estimate exists and "auto" decides on the ratio.
    data = repetitive(MiB) + os.urandom(300_000)
    local = MemoryTier("l")
    async with fs_on(tmp_path, [local, s3], MiB) as fs:
        await write_file(fs, b"ckpt.bin", data, step=MiB)
        await wait_backlog_empty(fs)
        assert uploader_of(fs).compressor.network_rate is None
    keys = sorted(local.frames)
    assert sorted(s3.list_keys()) == keys and len(keys) == 2
    codecs = {}
    for key in keys:
        obj = s3.get(key)
        assert obj is not None
        digest = bytes.fromhex(key)
        frame.verify(obj, digest)  # the object alone proves its plaintext
        header = frame.parse_header(obj)
        codecs[header.codec] = (len(obj), len(local.frames[key]), header.plain_len)
    lz4_len, raw_len, plain_len = codecs[Codec.LZ4]
    assert plain_len == MiB and lz4_len < raw_len // 8
    raw_sent, raw_local, _ = codecs[Codec.RAW]
    assert raw_sent == raw_local  # random bytes went as they were
    # A node with none of the local frames: ckptfs reads the remote copies, verified.
    empty = MemoryTier("l2")
    async with fs_on(tmp_path, [empty, s3], MiB) as fs:
        assert await read_file(fs, b"ckpt.bin") == data
    assert empty.frames == {}


def test_the_codec_and_the_config_name_the_same_modes() -> None:
    assert compress.MODES == config.REMOTE_COMPRESSION_MODES
