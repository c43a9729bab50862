"""Seeded sequences of mixed writes on a real mount, against a model of the file: FUSE
writes (sequential saves that take the one-pass staged path, overwrites inside a chunk
being assembled, holes, truncates, fsyncs) through write-only and read-write handles,
interleaved with direct-path WRITEs (whole chunks staged from the memfd, heads and tails
through the VFS), in an encrypted namespace (keyed ids, sealed frames) and a plain one.
Every file reads back bit-identical through FUSE and the socket, and again after a
remount (every chunk verified against its id). The save path and the direct path merged
into main without such a test; a wrong id or a reused buffer shows here as wrong bytes."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from tests.conftest import CkptFactory
from tests.support import encryption as enc
from tests.support.mountutil import wait_until

from ckptfs.client import DirectClient, connect, find_socket

MiB = 1 << 20


def _put(model: bytearray, off: int, data: bytes) -> None:
    if off > len(model):
        model.extend(b"\0" * (off - len(model)))
    model[off:off + len(data)] = data


def _fuse_ops(rng: random.Random, path: Path, model: bytearray) -> None:
    flags = rng.choice([os.O_WRONLY, os.O_RDWR])
    fd = os.open(path, flags | os.O_CREAT, 0o644)
    try:
        for _ in range(rng.randint(3, 12)):
            kind = rng.random()
            if kind < 0.55:
                data = os.urandom(rng.choice([1, 4096, 65536, 131072, 300_000, MiB, 3 * MiB]))
                off = rng.choice([len(model), rng.randint(0, len(model) + 2 * MiB),
                                  rng.randint(0, 6) * MiB])
                assert os.pwrite(fd, data, off) == len(data)
                _put(model, off, data)
            elif kind < 0.7:
                size = rng.randint(0, 8 * MiB)
                os.ftruncate(fd, size)
                del model[size:]
                model.extend(b"\0" * (size - len(model)))
            elif kind < 0.8:
                os.fsync(fd)
            elif flags == os.O_RDWR:
                off = rng.randint(0, len(model))
                assert os.pread(fd, 2 * MiB, off) == bytes(model[off:off + 2 * MiB])
    finally:
        os.close(fd)


def _direct_ops(rng: random.Random, c: DirectClient, path: Path, model: bytearray) -> None:
    if path.exists():
        h, _size = c.open(path, os.O_WRONLY)
    else:
        h = c.create(path, 0o644, os.O_WRONLY | os.O_CREAT)
    try:
        for _ in range(rng.randint(1, 4)):
            data = os.urandom(rng.choice([12345, MiB, 2 * MiB, 3 * MiB + 5, 4 * MiB]))
            off = rng.choice([len(model), rng.randint(0, 5) * MiB,
                              rng.randint(0, len(model) + MiB)])
            assert c.pwrite(h, data, off) == len(data)
            _put(model, off, data)
    finally:
        c.close(h)


@pytest.mark.parametrize("seed", range(4))
def test_mixed_fuse_and_direct_writes_read_back_bit_identical(
    ckpt_factory: CkptFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int,
) -> None:
    run = Path(os.environ.get("TMPDIR", "/tmp")) / f"ckptfs-run-{os.getpid()}-{tmp_path.name}"
    run.mkdir(mode=0o755)
    run.chmod(0o755)
    monkeypatch.setenv("CKPTFS_RUNTIME_DIR", str(run / "run"))
    try:
        kek_path, _kek = enc.kek_file(tmp_path / "keys" / "kek")
        cfg = enc.config(tmp_path / "ckptfs.toml", kek_path)
        # 1 MiB chunks: frames large enough for the tiers' O_DIRECT writes.
        m = ckpt_factory.mount(extra_args=("--chunk-size", "1MiB", "--config", str(cfg)))
        for d in ("proj-a", "open"):
            (m.mountpoint / d).mkdir(mode=0o777, exist_ok=True)
        wait_until(lambda: find_socket(m.mountpoint), what="the direct socket")
        c = connect(m.mountpoint, memory=4 * MiB)
        assert c is not None
        rng = random.Random(seed)
        models: dict[Path, bytearray] = {}
        with c:
            for _round in range(10):
                for ns in ("proj-a", "open"):
                    path = m.mountpoint / ns / f"f{rng.randint(0, 2)}.bin"
                    model = models.setdefault(path, bytearray())
                    if rng.random() < 0.4:
                        _direct_ops(rng, c, path, model)
                    else:
                        _fuse_ops(rng, path, model)
                    assert path.read_bytes() == model, (path, _round)
                    assert c.read_file(path) == model, (path, _round)
        ckpt_factory.remount(m)
        for path, model in models.items():
            assert path.read_bytes() == model, path
    finally:
        shutil.rmtree(run, ignore_errors=True)
