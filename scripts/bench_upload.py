#!/usr/bin/env python3
"""The upload path alone, in one process, against a real SeaweedFS on 127.0.0.1.

A local tier holds ``--chunks`` random 16 MiB frames; ``--threads`` (8, the default
``upload_concurrency``) worker threads copy them to an S3 tier the way the uploader does
(``ckptfs.upload.uploader.copy_frame``: the frame read from the local tier into a reused
buffer, its blake3 check, the lz4 decision, the SHA-256 of the checksum header, the PUT).
Against it, in the same run on the same server: a hand-written boto3 upload of the same
bytes (``upload_part`` of 16 MiB parts with a SHA-256 checksum each, 8 threads, as
scripts/bench_remote.py's baseline). Per variant and round: wall seconds, and CPU seconds
per GB of this process (getrusage) and of SeaweedFS (/proc). Rounds alternate the variants.

CPU per GB is what this measures: on a loaded machine the wall time means little.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import resource
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import botocore.config  # noqa: E402
from benchio import cpu_seconds  # noqa: E402

from tests.support.s3server import ACCESS_KEY, SECRET_KEY, SeaweedServer, find_weed  # noqa: E402

from ckptfs.chunks.bufpool import FramePool  # noqa: E402
from ckptfs.codec import frame  # noqa: E402
from ckptfs.codec.compress import RemoteCompressor  # noqa: E402
from ckptfs.config.model import S3TierConfig, TierConfig  # noqa: E402
from ckptfs.tiers.local import LocalTier  # noqa: E402
from ckptfs.tiers.s3 import S3Tier  # noqa: E402
from ckptfs.upload import uploader  # noqa: E402

MiB = 1 << 20
CHUNK = 16 * MiB


def self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def make_frames(local: LocalTier, n: int) -> list[bytes]:
    digests = []
    pattern = os.urandom(CHUNK + n * 4096)
    for i in range(n):
        data = memoryview(pattern)[i * 4096 : i * 4096 + CHUNK]
        d = frame.digest_of(data)
        local.put(d.hex(), frame.encode([data], d))
        digests.append(d)
    return digests


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--chunks", type=int, default=32)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default="ckptfs,boto3")
    args = ap.parse_args()
    weed = find_weed()
    if weed is None:
        raise SystemExit("weed not found")
    os.environ["AWS_ACCESS_KEY_ID"] = ACCESS_KEY
    os.environ["AWS_SECRET_ACCESS_KEY"] = SECRET_KEY
    with tempfile.TemporaryDirectory(dir="/work", prefix="ckptfs-bench-upload.") as tmp:
        base = Path(tmp)
        (base / "t0").mkdir()
        local = LocalTier(TierConfig(name="local0", kind="local", path=base / "t0"))
        local.open()
        server = SeaweedServer(base / "seaweed", weed=weed, volume_size_limit_mb=1024,
                               volume_max=64)
        server.start()
        try:
            digests = make_frames(local, args.chunks)
            nbytes = args.chunks * CHUNK
            raws = {d: bytes(local.get(d.hex()) or b"") for d in digests}  # boto3: in memory

            def ckptfs_variant() -> None:
                remote = S3Tier(S3TierConfig(name="remote0", bucket=server.bucket,
                                             prefix=f"p-{uuid.uuid4().hex[:8]}",
                                             endpoint_url=server.endpoint),
                                max_pool_connections=args.threads + 8)
                pool = FramePool(args.threads)
                comp = RemoteCompressor("auto")
                with ThreadPoolExecutor(args.threads) as ex:
                    list(ex.map(lambda d: uploader.copy_frame(d, [local], remote, comp, pool),
                                digests))
                remote.close()

            client: Any = server.session().client(
                "s3", endpoint_url=server.endpoint,
                config=botocore.config.Config(s3={"addressing_style": "path"},
                                              max_pool_connections=args.threads + 8))

            def boto3_variant() -> None:
                key = f"b3-{uuid.uuid4().hex[:8]}"
                uid = client.create_multipart_upload(Bucket=server.bucket, Key=key,
                                                     ChecksumAlgorithm="SHA256")["UploadId"]
                done: list[dict[str, Any]] = []
                lock = threading.Lock()

                def put(item: tuple[int, bytes]) -> None:
                    num, d = item
                    body = raws[d][frame.HEADER_SIZE:]  # the plaintext: 16 MiB exactly
                    sha = base64.b64encode(hashlib.sha256(body).digest()).decode()
                    r = client.upload_part(Bucket=server.bucket, Key=key, UploadId=uid,
                                           PartNumber=num, Body=body, ChecksumSHA256=sha)
                    with lock:
                        done.append({"PartNumber": num, "ETag": r["ETag"],
                                     "ChecksumSHA256": sha})

                with ThreadPoolExecutor(args.threads) as ex:
                    list(ex.map(put, enumerate(digests, 1)))
                client.complete_multipart_upload(
                    Bucket=server.bucket, Key=key,
                    MultipartUpload={"Parts": sorted(done, key=lambda p: p["PartNumber"])},
                    UploadId=uid)

            def put_variant(trim: int) -> Callable[[], None]:
                """S3Tier.put of the frames held in memory, ``trim`` bytes cut off (the
                header: 16 MiB objects exactly), SHA-256 as ckptfs sends."""
                def run() -> None:
                    remote = S3Tier(S3TierConfig(name="remote0", bucket=server.bucket,
                                                 prefix=f"q-{uuid.uuid4().hex[:8]}",
                                                 endpoint_url=server.endpoint),
                                    max_pool_connections=args.threads + 8)

                    def one(d: bytes) -> None:
                        body = memoryview(raws[d])[trim:]
                        sha = base64.b64encode(hashlib.sha256(body).digest()).decode()
                        remote.put(d.hex(), [body], expected_sha256=sha)

                    with ThreadPoolExecutor(args.threads) as ex:
                        list(ex.map(one, digests))
                    remote.close()
                return run

            variants: dict[str, Callable[[], None]] = {
                "ckptfs": ckptfs_variant, "boto3": boto3_variant,
                "put_frame": put_variant(0), "put_16mib": put_variant(frame.HEADER_SIZE)}
            names = args.variants.split(",")
            gb = nbytes / 1e9
            print(f"{args.chunks} chunks of 16 MiB ({gb:.2f} GB), {args.threads} threads; "
                  f"load average {os.getloadavg()[0]:.2f}")
            for r in range(args.rounds):
                order = names if r % 2 == 0 else names[::-1]
                for name in order:
                    c0, w0, t0 = self_cpu(), cpu_seconds(server.pid), time.perf_counter()
                    variants[name]()
                    t = time.perf_counter() - t0
                    c, w = self_cpu() - c0, (cpu_seconds(server.pid) or 0) - (w0 or 0)
                    print(f"round {r + 1} {name:10s}: {t:6.2f} s, CPU s/GB: this process "
                          f"{c / gb:.2f}, SeaweedFS {w / gb:.2f}; load average "
                          f"{os.getloadavg()[0]:.2f}", flush=True)
        finally:
            server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
