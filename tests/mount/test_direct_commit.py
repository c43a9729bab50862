"""A file written through the direct path's whole-chunk WRITE (docs/direct-path.md) is an
ordinary file of the mount: a checkpoint written through the socket is detected,
committed, audited and counted in its namespace's quota like the same checkpoint written
through FUSE; a write past the quota is refused there too and leaves the old version. A
client that scribbles on its shared memory while the daemon copies it out changes only
which bytes it wrote: every stored chunk holds the bytes its digest names (fsck --verify
is clean), and FUSE reads what the socket reads."""

from __future__ import annotations

import errno
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TEST_MOUNT_ARGS
from tests.mount.test_audit import export
from tests.mount.test_quotas import project, quota_config, used
from tests.support import encryption as enc
from tests.support.direct import direct_mounted
from tests.support.mountutil import Mount, run_cli, wait_until

from ckptfs.client import DirectClient, connect
from ckptfs.codec import frame
from ckptfs.codec.seal import Cipher

KiB = 1024
MiB = 1024 * KiB
CHUNK = 256 * KiB  # TEST_MOUNT_ARGS' chunk size: a 1 MiB memfd holds 4 whole chunks
pytestmark = pytest.mark.allow_log_warnings("quota")


@pytest.fixture
def mount(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Mount]:
    """/proj-a a namespace of root's with a 12 MiB quota; the socket in this test's
    runtime dir."""
    cfg = quota_config(tmp_path, "12MiB")
    with direct_mounted(tmp_path, monkeypatch, 1, (*TEST_MOUNT_ARGS, "--config", str(cfg))) as m:
        yield m


def client_of(m: Mount) -> DirectClient:
    c = connect(m.mountpoint, memory=MiB)
    assert c is not None
    return c


# A Hugging Face Trainer save (docs/frameworks.md): trainer_state.json last. The two big
# files are several whole chunks and a tail; the small ones take the VFS's write.
def hf_files(step: int) -> list[tuple[str, bytes]]:
    payload = os.urandom(2 * MiB + 12345)
    return [("config.json", b"{}"), ("model.safetensors", payload),
            ("optimizer.pt", payload[::-1]), ("scheduler.pt", b"s"),
            ("rng_state.pth", b"r"), ("trainer_state.json", json.dumps({"step": step}).encode())]


def ls(path: Path) -> dict[str, dict[str, Any]]:
    res = run_cli("ls", str(path), "--json")
    assert res.returncode == 0, res.stderr
    return {c["root"]: c for c in json.loads(res.stdout)}


def same_kind(ck: dict[str, Any]) -> dict[str, Any]:
    """What two saves of the same files must share: all but names, ids and timings."""
    return {k: v for k, v in ck.items()
            if k not in ("root", "path", "step", "id") and not k.endswith(("_s", "_ns", "at"))
            and "time" not in k and "created" not in k}


def file_actions(records: list[dict[str, Any]], ckpt: str) -> dict[str, list[tuple[str, int]]]:
    """Each file's audit records of changes under ``ckpt`` (action, uid), by file name.
    Not the notes of opens for reading: this test's own reads make them, written by the
    audit flusher whenever it runs."""
    out: dict[str, list[tuple[str, int]]] = {}
    for r in records:
        if r["path"] and r["path"].startswith(ckpt + "/") and r["action"] != "open":
            out.setdefault(r["path"][len(ckpt) + 1:], []).append((r["action"], r["uid"]))
    return out


def test_a_checkpoint_written_through_the_socket_is_committed_like_one_through_fuse(
    mount: Mount,
) -> None:
    run = project(mount) / "run"
    fuse, direct = hf_files(1), hf_files(2)
    (run / "checkpoint-1").mkdir(parents=True)
    for name, data in fuse:
        (run / "checkpoint-1" / name).write_bytes(data)
    (run / "checkpoint-2").mkdir()
    with client_of(mount) as c:
        for name, data in direct:
            c.write_file(run / "checkpoint-2" / name, data)
    # The detector saw both saves end (trainer_state.json's close) and committed them.
    wait_until(lambda: {k: v["state"] for k, v in ls(run).items()} == {
        "/proj-a/run/checkpoint-1": "committed", "/proj-a/run/checkpoint-2": "committed"},
        what="both checkpoints committed")
    cks = ls(run)
    one, two = cks["/proj-a/run/checkpoint-1"], cks["/proj-a/run/checkpoint-2"]
    assert (one["step"], two["step"]) == (1, 2)
    assert same_kind(one) == same_kind(two)  # files, bytes, framework, state, ...
    for name, data in direct:  # bit-identical through FUSE
        assert (run / "checkpoint-2" / name).read_bytes() == data
    # The same audit records per file (a create, then the close's commit) for both.
    records = export(mount.mountpoint)
    by_fuse = file_actions(records, "/proj-a/run/checkpoint-1")
    by_socket = file_actions(records, "/proj-a/run/checkpoint-2")
    assert by_socket == by_fuse and set(by_socket) == {n for n, _ in direct}
    assert all(("commit", 0) in acts for acts in by_socket.values())
    # Both counted in the namespace's quota.
    assert used(mount) == sum(len(d) for _, d in fuse) + sum(len(d) for _, d in direct)


def test_a_write_through_the_socket_past_the_quota_is_refused_and_the_old_version_stays(
    mount: Mount,
) -> None:
    ns = project(mount)
    old = os.urandom(MiB + 5)
    (ns / "model.pt").write_bytes(old)
    with client_of(mount) as c:
        h = c.create(ns / "model.pt")
        with pytest.raises(OSError) as refused:
            c.pwrite(h, os.urandom(16 * MiB), 0)  # whole chunks: past 12 MiB at once
        assert refused.value.errno == errno.EDQUOT
        with pytest.raises(OSError) as at_close:
            c.close(h)
        assert at_close.value.errno == errno.EDQUOT
    assert (ns / "model.pt").read_bytes() == old  # nothing of the refused version
    assert used(mount) == len(old)
    assert "quota: write at" in mount.log and "EDQUOT" in mount.log


def test_a_client_scribbling_on_its_memory_during_a_write_cannot_corrupt_a_chunk(
    mount: Mount,
) -> None:
    """Another thread of the client rewrites the whole memfd (each pass one byte value)
    while the daemon copies whole chunks out of it: each chunk is some mix of passes,
    but the daemon hashed and stored its own copy, so the chunk holds exactly the bytes
    its digest names."""
    path = mount.mountpoint / "scribbled.bin"
    stop = threading.Event()
    values: set[int] = set()
    with client_of(mount) as c:

        def scribble() -> None:
            v = 0
            while not stop.is_set():
                v = v % 255 + 1
                values.add(v)
                c.mem[:] = bytes([v]) * c.memory

        h = c.create(path)
        t = threading.Thread(target=scribble)
        t.start()
        try:
            for i in range(16):  # 16 MiB, 64 whole chunks
                assert c.write_staged(h, i * MiB, MiB) == MiB
        finally:
            stop.set()
            t.join()
        c.close(h)
        through_socket = bytes(c.read_file(path))
    through_fuse = path.read_bytes()
    assert through_fuse == through_socket and len(through_fuse) == 16 * MiB
    assert set(through_fuse) <= values  # bytes the client wrote, nothing else
    mount.stop()
    res = run_cli("fsck", "--state-dir", str(mount.state_dir), "--verify", timeout=180)
    assert res.returncode == 0 and "fsck: clean" in res.stdout, res.stdout + res.stderr


def test_whole_chunks_through_the_socket_are_sealed_in_an_encrypted_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    kek_path, _kek = enc.kek_file(tmp_path / "keys" / "kek")
    cfg = enc.config(tmp_path / "ckptfs.toml", kek_path)
    data = enc.marked(3 * MiB + 4321)  # 12 whole chunks and a tail
    with direct_mounted(tmp_path, monkeypatch, 1, (*TEST_MOUNT_ARGS, "--config", str(cfg))) as m:
        assert (m.mountpoint / "proj-a").is_dir()  # the namespace's root, made at mount
        path = m.mountpoint / "proj-a" / "w.bin"
        with client_of(m) as c:
            c.write_file(path, data)
        assert path.read_bytes() == data
        raw = enc.frames(m.locals)
        cat = enc.open_catalog(m.state_dir)
        try:
            ids = enc.chunk_ids(cat, path)
        finally:
            cat.close()
    assert len(ids) == 13
    for k in ids:
        assert frame.parse_header(raw[k]).cipher == Cipher.AES256GCM, k
        assert enc.MARKER not in raw[k], f"plaintext in sealed frame {k[:16]}"
