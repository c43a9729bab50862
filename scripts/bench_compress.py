#!/usr/bin/env python3
"""lz4 for remote copies: ratio, speed and the per-chunk decision on 16 MiB chunks.

For each kind of data (random bytes, and tensors made by torch: init weights, weights and
Adam moments after a short real training run, their bf16/fp16 casts, an int64 token-id
tensor, a zero tensor) one 16 MiB chunk is framed as ckptfs frames it and measured:

* ratio: lz4 block body / plaintext, whole chunk;
* compress: GB/s of ``lz4.block.compress`` on the whole chunk; verify: GB/s of
  ``frame.verify`` on the LZ4 frame (decompress + blake3), what the uploader pays as well;
* sample: the ratio estimated from ckptfs.codec.compress's 4 x 64 KiB samples, and the time
  that sampling decision takes (``remote_frame`` on data it leaves raw is nothing else);
* CPU ms: what compressing and verifying the whole chunk is estimated to cost (sample cost
  plus the fresh-memory cost a RemoteCompressor learned from the compressible chunks here)
  against what it measured (compress + encode_lz4 + frame.verify);
* the decision ``remote_frame`` takes with the network rate unknown, at 125 MB/s (1 Gb/s)
  and at 1.25 GB/s (10 Gb/s), with that learned memory cost.

Times are the median of --repeat runs. Prints a markdown table. Runs on whatever cores the
machine has (noted in the output, with the load average, since other work may share them).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import lz4  # noqa: E402
import lz4.block  # noqa: E402
import torch  # noqa: E402

from ckptfs.codec import compress, frame  # noqa: E402
from ckptfs.codec.frame import Codec  # noqa: E402

MiB = 1 << 20
CHUNK = 16 * MiB
RATES = {"unknown": None, "1 Gb/s": 125e6, "10 Gb/s": 1.25e9}


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The bytes a checkpoint file holds for a tensor (as torch.save / safetensors store)."""
    t = t.detach().contiguous().cpu()
    return t.view(torch.uint8).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()


def chunk_of(parts: list[torch.Tensor]) -> bytes:
    """The first 16 MiB of the tensors laid end to end (a chunk of a checkpoint file)."""
    out = b"".join(tensor_bytes(p) for p in parts)
    assert len(out) >= CHUNK, (len(out), CHUNK)
    return out[:CHUNK]


def trained_model(steps: int) -> tuple[torch.nn.Module, torch.optim.Adam]:
    """A small MLP (about 8.4 M parameters) trained for a few Adam steps on a random
    regression task: real fp32 weights and optimizer moments, not synthetic patterns."""
    torch.manual_seed(0)
    width = 1448
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.GELU(),
        torch.nn.Linear(width, width), torch.nn.GELU(),
        torch.nn.Linear(width, width), torch.nn.GELU(),
        torch.nn.Linear(width, width),
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(256, width)
    y = torch.randn(256, width)
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    return model, opt


def datasets(steps: int) -> dict[str, bytes]:
    torch.manual_seed(1)
    model, opt = trained_model(steps)
    weights = [p.detach() for p in model.parameters()]
    state = [opt.state[p] for p in model.parameters()]
    return {
        "random bytes": os.urandom(CHUNK),
        "fp32 init, randn*0.02": chunk_of([torch.randn(CHUNK // 4) * 0.02]),
        f"fp32 weights, trained ({steps} Adam steps)": chunk_of(weights),
        "fp32 Adam exp_avg": chunk_of([s["exp_avg"] for s in state]),
        "fp32 Adam exp_avg_sq": chunk_of([s["exp_avg_sq"] for s in state]),
        "fp32 upcast from bf16": chunk_of([w.to(torch.bfloat16).float() for w in weights]),
        "bf16 weights, trained": chunk_of([w.to(torch.bfloat16) for w in weights] * 2),
        "bf16 init, randn*0.02": chunk_of([(torch.randn(CHUNK // 2) * 0.02).to(torch.bfloat16)]),
        "fp16 weights, trained": chunk_of([w.half() for w in weights] * 2),
        "int64 token ids (< 50257)": chunk_of([torch.randint(0, 50257, (CHUNK // 8,))]),
        "int64 zeros (step counters, empty buffers)": chunk_of([torch.zeros(CHUNK // 8, dtype=torch.int64)]),
    }


def median_s(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def framed(plain: bytes) -> tuple[bytes, bytes]:
    digest = frame.digest_of(plain)
    return b"".join(bytes(p) for p in frame.encode([plain], digest)), digest


def digest_and_pipeline(plain: bytes) -> Callable[[], None]:
    """The digest of a chunk and then its pipeline, as one timed call."""
    return lambda: whole_pipeline(plain, frame.digest_of(plain))


def whole_pipeline(plain: bytes, digest: bytes) -> None:
    """What the uploader does for a chunk it compresses (besides the sample)."""
    body = lz4.block.compress(plain, store_size=False)
    frame.verify(frame.encode_lz4(body, len(plain), digest), digest)


def learn_memory_cost(data: dict[str, bytes]) -> float:
    """Let a RemoteCompressor compress the chunks it would compress with no rate known."""
    c = compress.RemoteCompressor("auto")
    for _ in range(3):
        for plain in data.values():
            c.frame_for(*framed(plain))
    return c.memory_s_per_byte


def measure(name: str, plain: bytes, repeat: int, memory_s_per_byte: float) -> list[str]:
    raw, digest = framed(plain)
    view = memoryview(raw)[frame.HEADER_SIZE:]
    body = lz4.block.compress(plain, store_size=False)
    packed = frame.encode_lz4(body, len(plain), digest)
    ratio = len(body) / len(plain)
    t_comp = median_s(lambda: lz4.block.compress(plain, store_size=False), repeat)
    t_verify = median_s(lambda: frame.verify(packed, digest), repeat)
    t_whole = median_s(lambda: whole_pipeline(plain, digest), repeat)
    ests = [compress.estimate(view) for _ in range(repeat)]
    t_sample = median_s(lambda: compress.estimate(view), repeat)
    est_ratio = ests[0].ratio
    est_s = statistics.median(e.cpu_s(len(plain), memory_s_per_byte) for e in ests)
    decisions = []
    for rate in RATES.values():
        _, choice = compress.remote_frame(raw, digest, "auto", rate, memory_s_per_byte)
        decisions.append("lz4" if choice.codec == Codec.LZ4 else "raw")
    return [
        name,
        f"{ratio:.3f}",
        f"{len(plain) / t_comp / 1e9:.2f}",
        f"{len(plain) / t_verify / 1e9:.2f}",
        f"{est_ratio:.3f}",
        f"{t_sample * 1e3:.2f}",
        f"{est_s * 1e3:.1f}",
        f"{t_whole * 1e3:.1f}",
        *decisions,
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per figure (median)")
    ap.add_argument("--steps", type=int, default=20, help="Adam steps of the small model")
    args = ap.parse_args()
    load0 = os.getloadavg()
    data = datasets(args.steps)
    header = [
        "data (16 MiB chunk)", "lz4 ratio", "compress GB/s", "verify GB/s", "sample ratio",
        "sampling ms", "est. CPU ms", "actual CPU ms", *(f"decision, {r}" for r in RATES),
    ]
    # The cost of a whole chunk depends on whether its buffers land on fresh pages (a host
    # fault each on this VM), which depends on the allocator's state: measure before too.
    first = {k: data[k] for k in ("random bytes", "int64 token ids (< 50257)")}
    before = {k: median_s(digest_and_pipeline(p), args.repeat)
              for k, p in first.items()}
    memory_s_per_byte = learn_memory_cost(data)
    rows = [measure(name, plain, args.repeat, memory_s_per_byte) for name, plain in data.items()]
    sha_s = median_s(lambda: hashlib.sha256(data["random bytes"]).digest(), args.repeat)
    load1 = os.getloadavg()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, lz4 {lz4.__version__} (library "
          f"{lz4.library_version_string()}), torch {torch.__version__}; load average "
          f"{load0[0]:.2f} before, {load1[0]:.2f} after; median of {args.repeat} runs; "
          f"sample {compress.SAMPLES} x {compress.SAMPLE_SIZE // 1024} KiB, "
          f"MAX_RATIO {compress.MAX_RATIO}")
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()
    print(f"learned fresh-memory cost: {memory_s_per_byte * 1e9:.2f} ns/byte; for scale: "
          f"SHA-256 of a 16 MiB chunk (done for every upload) {sha_s * 1e3:.1f} ms, sending "
          f"16 MiB takes {CHUNK / 125e6 * 1e3:.0f} ms at 1 Gb/s, "
          f"{CHUNK / 1.25e9 * 1e3:.1f} ms at 10 Gb/s")
    print("whole-chunk compress + verify (incl. blake3) in this process before the learning "
          "pass: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in before.items()))


if __name__ == "__main__":
    main()
