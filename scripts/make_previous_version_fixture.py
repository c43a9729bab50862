#!/usr/bin/env python3
"""Make tests/data/previous-version.tar.gz: a node's state dir, local tiers and bucket objects
written by an OLDER ckptfs, for tests/remote/test_previous_version.py (issue 13: an existing state dir
and bucket must mount and read as before).

    PYTHONPATH=. .venv/bin/python scripts/make_previous_version_fixture.py COMMIT

COMMIT's ckptfs is checked out into a temporary git worktree and run as the daemon (the venv is
this checkout's); a SeaweedFS on 127.0.0.1 serves the bucket. The archive holds ``state/``
(the catalog, no logs), ``tier0/``, ``tier1/``, ``bucket/`` (the objects under the prefix, one
file per key) and ``manifest.json`` (what was written: bytes' SHA-256, modes, mtimes, xattrs,
links, the checkpoints ``ckptfs ls --json`` listed, the commit).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import uuid
from pathlib import Path

from tests.support.s3server import ACCESS_KEY, SECRET_KEY, running_seaweed

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "data" / "previous-version.tar.gz"
KiB = 1024


def ckptfs(old: Path, env: dict[str, str], *args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "ckptfs", *args], env=env, cwd=old,
                         capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise SystemExit(f"ckptfs {' '.join(args)}: exit {res.returncode}\n{res.stderr}")
    return res.stdout


def write_tree(mnt: Path) -> None:
    """What a training job leaves: an HF checkpoint (multi-chunk, one file compressible), a
    'latest' pointer, a symlink, a hard link, a user xattr, a chmod and an mtime."""
    rng = hashlib.sha256(b"ckptfs previous version").digest()
    payload = b"".join(hashlib.sha256(rng + i.to_bytes(4, "big")).digest()
                       for i in range(200 * KiB // 32))  # 200 KiB: four 64 KiB chunks
    d = mnt / "run" / "checkpoint-5"
    d.mkdir(parents=True)
    for name, data in (("config.json", b"{}"), ("model.safetensors", payload),
                       ("optimizer.pt", bytes(150 * KiB)),  # zeros: lz4 on the remote
                       ("scheduler.pt", b"s"), ("rng_state.pth", b"r"),
                       ("trainer_state.json", json.dumps({"global_step": 5}).encode())):
        with open(d / name, "wb") as f:
            f.write(data)
    (mnt / "run" / "latest").write_text("checkpoint-5")
    os.chmod(mnt / "run" / "latest", 0o600)
    os.utime(mnt / "run" / "latest", ns=(1_000_000_000, 1_234_567_890_123))
    os.symlink("checkpoint-5/model.safetensors", mnt / "run" / "model-link")
    os.link(d / "config.json", mnt / "run" / "config-hardlink.json")
    os.setxattr(d / "model.safetensors", "user.note", b"kept across versions")


def manifest_of(mnt: Path) -> dict[str, object]:
    files: dict[str, object] = {}
    for p in sorted(mnt.rglob("*")):
        rel = str(p.relative_to(mnt))
        st = os.lstat(p)
        entry: dict[str, object] = {"mode": st.st_mode, "mtime_ns": st.st_mtime_ns,
                                    "size": st.st_size, "nlink": st.st_nlink}
        if p.is_symlink():
            entry["symlink"] = os.readlink(p)
        elif p.is_file():
            entry["sha256"] = hashlib.sha256(p.read_bytes()).hexdigest()
            entry["xattrs"] = {k: os.getxattr(p, k).decode() for k in os.listxattr(p)
                               if k.startswith("user.") and not k.startswith("user.ckptfs.")}
        files[rel] = entry
    return files


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    commit = subprocess.run(["git", "rev-parse", sys.argv[1]], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        old = tmp / "old"
        subprocess.run(["git", "worktree", "add", "--detach", str(old), commit], cwd=REPO,
                       check=True, capture_output=True)
        try:
            with running_seaweed(tmp / "seaweed", 0.5) as server:
                prefix = f"prev-{uuid.uuid4().hex[:8]}"
                env = dict(os.environ, PYTHONPATH=str(old), AWS_ACCESS_KEY_ID=ACCESS_KEY,
                           AWS_SECRET_ACCESS_KEY=SECRET_KEY)
                node = tmp / "node"
                for d in ("tier0", "tier1", "mnt"):
                    (node / d).mkdir(parents=True)
                url = f"s3://{server.bucket}/{prefix}?endpoint={server.endpoint}"
                mnt = node / "mnt"
                ckptfs(old, env, "mount", str(mnt), "--state-dir", str(node / "state"),
                       "--local", str(node / "tier0"), "--local", str(node / "tier1"),
                       "--chunk-size", "64KiB", "--remote", url, "--allow-shared-device")
                try:
                    write_tree(mnt)
                    ckptfs(old, env, "sync", str(mnt), "--timeout", "60")
                    listing = json.loads(ckptfs(old, env, "ls", str(mnt / "run"), "--json"))
                    files = manifest_of(mnt)
                finally:
                    ckptfs(old, env, "umount", str(mnt))
                client = server.client()
                bucket = node / "bucket"
                for page in client.get_paginator("list_objects_v2").paginate(
                        Bucket=server.bucket, Prefix=f"{prefix}/"):
                    for o in page.get("Contents") or ():
                        dest = bucket / o["Key"][len(prefix) + 1:]
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        dest.write_bytes(client.get_object(Bucket=server.bucket,
                                                           Key=o["Key"])["Body"].read())
                client.close()
            manifest = {"commit": commit, "chunk_size": 64 * KiB, "files": files,
                        "checkpoints": listing}
            (node / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
            shutil.rmtree(node / "mnt")
            for p in (node / "state").iterdir():  # logs and pid files are not state
                if p.suffix in (".log", ".pid") or p.name.endswith(".addr"):
                    p.unlink()
            OUT.parent.mkdir(parents=True, exist_ok=True)
            with tarfile.open(OUT, "w:gz") as tar:
                for p in sorted(node.iterdir()):
                    tar.add(p, arcname=p.name)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=REPO,
                           check=False, capture_output=True)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes) from {commit}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
