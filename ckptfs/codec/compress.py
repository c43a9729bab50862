"""lz4 for the copy of a chunk sent to a remote tier, decided per chunk.

Local tiers always hold RAW frames (reading them costs no decompression). The copy sent to
a remote tier may be an LZ4 frame instead, when that pays: most checkpoint bytes are float
tensors whose mantissas look random to lz4, so compressing everything would burn CPU for
nothing, while zero-filled or integer tensors shrink a lot. Each chunk is judged on its own:

1. Compress SAMPLES spread-out slices of SAMPLE_SIZE bytes, timing what a compressed copy
   costs per byte of plaintext: compress, then verify (lz4 decompress + blake3).
2. Stay raw if the sampled ratio (compressed / plain) is MAX_RATIO or more.
3. With a known network rate, stay raw unless the wire time saved,
   (plain - compressed) / rate, exceeds the CPU time spent:
   plain * sample_cost + memory_cost * (compressed + plain).
4. Compress the whole chunk; keep it only if it really is below MAX_RATIO and the LZ4 frame
   passes ``frame.verify`` (we never upload bytes we cannot vouch for); else send raw.

Why a memory term: the samples run in cache on buffers the allocator reuses, but a whole
chunk may write its compressed copy and the decompressed check into fresh pages, and on
the benchmark VM a fresh page costs a host fault (lz4 on a 16 MiB random chunk took about
18 ms with its output on fresh pages, 3 ms with reused memory; docs/performance-history.md). That
depends on the allocator's state, so ``RemoteCompressor`` learns the cost per byte from the
whole chunks it compresses (0 until the first one). So that one slow
first measurement cannot switch compression off for good, every PROBE_EVERY-th chunk is
decided on its ratio alone (a compressible one is compressed and measured again).

"off" never compresses; "always" skips the sample and keeps any LZ4 frame smaller than the
raw one (still verified). Everything here is blocking: call it from a worker thread.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import blake3
import lz4.block

from ..errors import CorruptChunk
from . import frame
from .frame import Buffer, Codec
from .seal import Cipher

log = logging.getLogger("ckptfs.compress")

MODES = ("auto", "off", "always")  # config.REMOTE_COMPRESSION_MODES (a test keeps them equal)
SAMPLES = 4
SAMPLE_SIZE = 64 * 1024
# Below 10 % saved, a compressed copy is not worth a decompression on every remote read.
MAX_RATIO = 0.9
# Puts smaller than this are dominated by request latency: they say little about the rate.
RATE_MIN_BYTES = 1 << 20
RATE_EWMA = 0.3  # weight of the newest observation in the rate and memory cost estimates
PROBE_EVERY = 32


def _lz4_compress(data: Buffer) -> bytes:
    """The one place that compresses (tests replace it to simulate a broken compressor)."""
    return lz4.block.compress(data, store_size=False)


@dataclass(frozen=True)
class Estimate:
    ratio: float  # compressed / plain over the samples (inf if a sample failed)
    cost_s_per_byte: float  # compress + verify per plaintext byte, measured on the samples
    sampled: int  # bytes sampled
    whole: bytes | None  # the compressed body, when the samples were the whole plaintext

    def cpu_s(self, plain_len: int, memory_s_per_byte: float = 0.0) -> float:
        """Estimated CPU time to compress and verify a whole chunk of ``plain_len`` bytes."""
        fresh = plain_len * (1.0 + self.ratio)  # compressed copy + decompressed check
        return plain_len * self.cost_s_per_byte + fresh * memory_s_per_byte


@dataclass(frozen=True)
class Choice:
    """What was sent for one chunk."""

    codec: Codec
    plain_len: int
    raw_len: int  # length of the RAW frame
    sent_len: int  # length of the frame actually sent
    reason: str
    # Set when the whole chunk was compressed (and verified): what that took, and the
    # sample's estimate of it without the memory term. RemoteCompressor learns from them.
    whole_s: float | None = None
    sample_est_s: float | None = None

    @property
    def saved(self) -> int:
        return self.raw_len - self.sent_len


def _slices(plain: memoryview) -> list[memoryview]:
    n = len(plain)
    if n <= SAMPLES * SAMPLE_SIZE:
        return [plain]
    # Evenly spread, first and last included: a chunk often mixes tensors of several kinds.
    step = (n - SAMPLE_SIZE) // (SAMPLES - 1)
    return [plain[i * step : i * step + SAMPLE_SIZE] for i in range(SAMPLES)]


def estimate(plain: Buffer) -> Estimate:
    """Sample ``plain``: the lz4 ratio and the CPU cost per byte of a compressed copy."""
    slices = _slices(memoryview(plain))
    sampled = sum(len(s) for s in slices)
    started = time.perf_counter()
    try:
        bodies = [_lz4_compress(s) for s in slices]
        for s, body in zip(slices, bodies, strict=True):
            # What frame.verify does on the whole chunk. (No byte comparison with the sample:
            # the whole frame is verified before use, and memoryview == is slow.)
            blake3.blake3(lz4.block.decompress(body, uncompressed_size=len(s))).digest()
    except Exception as exc:  # lz4 raises a bare LZ4BlockError
        log.error("lz4 sample failed, sending chunks raw: %s", exc)
        return Estimate(float("inf"), float("inf"), sampled, None)
    elapsed = time.perf_counter() - started
    ratio = sum(len(b) for b in bodies) / sampled if sampled else float("inf")
    whole = bodies[0] if len(slices) == 1 and len(slices[0]) == len(plain) else None
    return Estimate(ratio, elapsed / max(sampled, 1), sampled, whole)


def worth_it(
    est: Estimate, plain_len: int, network_rate: float | None, memory_s_per_byte: float = 0.0
) -> tuple[bool, str]:
    """The "auto" decision from a sample. ``network_rate`` in bytes/s, None if unknown."""
    if est.ratio >= MAX_RATIO:
        return False, f"sample ratio {est.ratio:.3f} >= {MAX_RATIO}"
    if network_rate is None:
        return True, f"sample ratio {est.ratio:.3f}, network rate unknown"
    saved_s = plain_len * (1.0 - est.ratio) / network_rate
    cost_s = est.cpu_s(plain_len, memory_s_per_byte)
    why = f"compressing costs {cost_s * 1e3:.1f} ms, saves {saved_s * 1e3:.1f} ms"
    return cost_s < saved_s, why


def remote_frame(
    raw: Buffer,
    digest: bytes,
    mode: str = "auto",
    network_rate: float | None = None,
    memory_s_per_byte: float = 0.0,
) -> tuple[Buffer, Choice]:
    """The frame to send to a remote tier for the verified RAW frame ``raw`` of chunk
    ``digest``: ``raw`` itself, or a verified LZ4 frame of the same plaintext."""
    if mode not in MODES:
        raise ValueError(f"remote compression mode {mode!r} (expected one of {MODES})")
    header = frame.parse_header(raw)

    def as_raw(reason: str) -> tuple[Buffer, Choice]:
        return raw, Choice(Codec.RAW, header.plain_len, len(raw), len(raw), reason)

    if header.codec != Codec.RAW:
        return as_raw("not a raw frame")
    if header.cipher != Cipher.NONE:  # ciphertext does not shrink: sealed frames go as they are
        return as_raw("sealed")
    if mode == "off" or header.plain_len == 0:
        return as_raw("off" if mode == "off" else "empty")
    plain = memoryview(raw)[frame.HEADER_SIZE : frame.HEADER_SIZE + header.plain_len]
    body: bytes | None = None
    limit = header.plain_len  # "always": any saving
    sample_est_s = None
    if mode == "auto":
        est = estimate(plain)
        ok, why = worth_it(est, header.plain_len, network_rate, memory_s_per_byte)
        if not ok:
            return as_raw(why)
        body = est.whole
        limit = int(header.plain_len * MAX_RATIO)
        if body is None:  # the whole chunk gets compressed below: a measurement to learn from
            sample_est_s = est.cpu_s(header.plain_len)
    started = time.perf_counter()
    try:
        if body is None:
            body = _lz4_compress(plain)
    except Exception as exc:  # a failed optimisation must not fail the upload
        log.error("lz4 failed on chunk %s, sending it raw: %s", digest.hex()[:16], exc)
        return as_raw("lz4 failed")
    if len(body) >= limit:
        return as_raw(f"whole-chunk ratio {len(body) / header.plain_len:.3f} too high")
    packed = frame.encode_lz4(body, header.plain_len, digest)
    try:
        frame.verify(packed, digest)
    except CorruptChunk as exc:
        log.error("lz4 frame of chunk %s failed verification, sending it raw: %s",
                  digest.hex()[:16], exc)
        return as_raw("lz4 frame failed verification")
    ratio = len(body) / header.plain_len
    return packed, Choice(
        Codec.LZ4, header.plain_len, len(raw), len(packed), f"ratio {ratio:.3f}",
        whole_s=time.perf_counter() - started, sample_est_s=sample_est_s,
    )


class RemoteCompressor:
    """One per uploader: the mode, a network rate estimated from completed puts, counters.
    Shared by the uploader's worker threads."""

    def __init__(self, mode: str = "auto") -> None:
        if mode not in MODES:
            raise ValueError(f"remote compression mode {mode!r} (expected one of {MODES})")
        self.mode = mode
        self.network_rate: float | None = None  # bytes/s of one put, None until measured
        # Seconds per byte of fresh memory a whole chunk writes beyond what its sample costs
        # (compressed copy + decompressed check), learned from whole chunks; 0 until then.
        self.memory_s_per_byte = 0.0
        self._memory_learned = False
        self._chunks = 0
        self.chunks_lz4 = 0
        self.chunks_raw = 0
        self.bytes_saved = 0  # frame bytes not sent thanks to lz4
        self._lock = threading.Lock()

    def frame_for(self, raw: Buffer, digest: bytes) -> tuple[Buffer, Choice]:
        with self._lock:
            self._chunks += 1
            probe = self._chunks % PROBE_EVERY == 0
        rate = None if probe else self.network_rate  # a probe: ratio alone, then learn
        sent, choice = remote_frame(raw, digest, self.mode, rate, self.memory_s_per_byte)
        if choice.whole_s is not None and choice.sample_est_s is not None:
            self.learn(choice.whole_s, choice.sample_est_s, choice.plain_len + choice.sent_len)
        return sent, choice

    def learn(self, whole_s: float, sample_est_s: float, fresh_bytes: int) -> None:
        """A whole chunk took ``whole_s`` where its sample predicted ``sample_est_s``: put
        the difference on the fresh bytes it wrote."""
        observed = max(0.0, whole_s - sample_est_s) / max(fresh_bytes, 1)
        with self._lock:
            if not self._memory_learned:
                self.memory_s_per_byte, self._memory_learned = observed, True
            else:
                self.memory_s_per_byte += RATE_EWMA * (observed - self.memory_s_per_byte)

    def sent(self, choice: Choice, seconds: float) -> None:
        """A put of ``choice.sent_len`` bytes succeeded in ``seconds``. The rate is per put
        (not summed over concurrent puts): it is what this chunk's upload saves per byte,
        and the sample's CPU time is measured under the same concurrency."""
        with self._lock:
            if choice.codec == Codec.LZ4:
                self.chunks_lz4 += 1
                self.bytes_saved += choice.saved
            else:
                self.chunks_raw += 1
            if choice.sent_len >= RATE_MIN_BYTES and seconds > 0:
                rate = choice.sent_len / seconds
                old = self.network_rate
                self.network_rate = rate if old is None else old + RATE_EWMA * (rate - old)
