"""Restore drills on real mounts with the real SeaweedFS (ckptfs/drill/, docs/operations.md
"Restore drills"): a drill passes on a good checkpoint and is recorded in the catalog,
`ckptfs status`, /metrics and the audit log; a flipped byte in the bucket's copy fails it
loudly although the local copy is good; a shredded key fails it; another namespace's
principal (and root) cannot read a namespace's checkpoint; a drill waits for a save."""

from __future__ import annotations

import errno
import io
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.mount.test_checkpoints import states
from tests.mount.test_posix_perms import as_user, needs_root
from tests.remote.test_remote_mount import remote_objects
from tests.support import encryption as enc
from tests.support.mountutil import (
    FUSE_AVAILABLE,
    SKIP_REASON,
    Mount,
    ckptfs_cmd,
    mounted,
    run_cli,
    wait_until,
)
from tests.support.s3server import SeaweedServer

from ckptfs.catalog import SqliteCatalog
from ckptfs.testing.exposition import sample, scrape

pytestmark = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)

FAILED = "restore drill of"  # the daemon's WARNING line of a failed drill


def _args(url: str, cfg: Path) -> tuple[str, ...]:
    return ("--chunk-size", "256KiB", "--remote", url, "--config", str(cfg))


def _config(tmp_path: Path, text: str = "") -> Path:
    cfg = tmp_path / "ckptfs.toml"
    cfg.write_text(f'[drill]\nscratch = "{tmp_path / "scratch"}"\n' + text)
    return cfg


def _sync(path: Path) -> None:
    res = run_cli("sync", str(path), "--timeout", "60", timeout=90)
    assert res.returncode == 0, res.stdout + res.stderr


def _st(payload: bytes) -> bytes:
    """``payload`` as the one U8 tensor of a safetensors file (the drill checks the format)."""
    header = json.dumps({"t": {"dtype": "U8", "shape": [len(payload)],
                               "data_offsets": [0, len(payload)]}}).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + payload


def _pt(obj: object) -> bytes:
    import torch  # the test venv's: real torch.save archives for the drill's zip checks

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def hf_save(ckdir: Path, step: int, payload: bytes) -> None:
    """A Hugging Face Trainer save (docs/frameworks.md) in the formats the drill checks:
    safetensors, torch.save archives, trainer_state.json last."""
    import torch

    d = ckdir / f"checkpoint-{step}"
    d.mkdir(parents=True)
    for name, data in (("config.json", b"{}"), ("model.safetensors", _st(payload)),
                       ("optimizer.pt", _pt({"state": torch.frombuffer(bytearray(payload[::-1]),
                                                                        dtype=torch.uint8)})),
                       ("scheduler.pt", _pt({"last_epoch": step})), ("rng_state.pth", _pt({"seed": 1})),
                       ("trainer_state.json", json.dumps({"step": step}).encode())):
        with open(d / name, "wb") as f:
            f.write(data)


def _saved(m: Mount, run: Path, step: int, payload: bytes) -> str:
    """An HF checkpoint, committed and durable on the remote; its root in the mount."""
    hf_save(run, step, payload)
    root = f"/{run.relative_to(m.mountpoint)}/checkpoint-{step}"
    wait_until(lambda: states(run).get(root) == "committed", what="commit")
    _sync(run)
    return root


def _state(m: Mount, root: str) -> str | None:
    cat = SqliteCatalog(m.state_dir / "catalog.sqlite", readonly=True)
    try:
        return next((r.state.value for r in cat.checkpoint_rows(root) if r.root == root), None)
    finally:
        cat.close()


def drill(*args: str) -> tuple[int, list[dict[str, Any]], str]:
    res = run_cli("drill", "--json", *args, timeout=120)
    return res.returncode, json.loads(res.stdout or "[]"), res.stderr


def _audit(m: Mount) -> list[dict[str, Any]]:
    res = run_cli("audit", "tail", str(m.mountpoint), "-n", "50", "--json")
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in res.stdout.splitlines() if line.strip()]


def _status(m: Mount) -> dict[str, Any]:
    res = run_cli("status", str(m.mountpoint), "--json")
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout))


def test_a_drill_passes_on_a_good_checkpoint_and_is_recorded(
    tmp_path: Path, remote: tuple[str, str],
) -> None:
    url, _ = remote
    payload = os.urandom(700_000)  # three chunks and a bit: several extents
    left = tmp_path / "scratch" / "123-4194311"  # a drill killed with its daemon (no such pid)
    left.mkdir(parents=True)
    (left / "model.safetensors").write_bytes(b"x")
    cfg = _config(tmp_path, 'runs = ["/run"]\n')
    with mounted(tmp_path / "node", 1, _args(url, cfg)) as m:
        run = m.mountpoint / "run"
        _saved(m, run, 1, payload)
        root = _saved(m, run, 2, payload[::-1])
        # The local copy of a chunk is damaged: a drill reads the bucket's, never this one.
        cat = enc.open_catalog(m.state_dir)
        try:
            victim = sorted(enc.chunk_ids(cat, run / "checkpoint-2" / "model.safetensors"))[0]
        finally:
            cat.close()
        local = enc.frame_path(m.locals, victim)
        local.write_bytes(local.read_bytes()[:-1] + b"?")
        rc, [report], err = drill(str(run))
        assert rc == 0, err
        assert report["result"] == "passed" and report["problems"] == []
        assert report["checkpoint"] == root  # the latest committed one
        total = sum(p.stat().st_size for p in (run / "checkpoint-2").iterdir())
        assert report["bytes"] == report["total_bytes"] == total
        assert report["implied_restore_s"] is not None and report["mb_per_s"] > 0
        assert not any((tmp_path / "scratch").iterdir())  # the restored files are gone
        # The catalog, status, metrics and the audit log have it.
        cat = SqliteCatalog(m.state_dir / "catalog.sqlite", readonly=True)
        try:
            [row] = cat.drill_rows("/run")
        finally:
            cat.close()
        assert (row.checkpoint, row.result, row.bytes) == (root, "passed", total)
        [shown] = _status(m)["drills"]
        assert (shown["run"], shown["result"], shown["checkpoint"]) == ("/run", "passed", root)
        plain = run_cli("status", str(m.mountpoint)).stdout
        assert "drill of /run: PASSED" in plain
        got = scrape(m.state_dir)
        assert sample(got, "ckptfs_drill_last_success_timestamp_seconds", run="/run") > 0
        assert sample(got, "ckptfs_drill_last_failed", run="/run") == 0
        assert sample(got, "ckptfs_drill_failures_total", run="/run") == 0
        assert sample(got, "ckptfs_drill_last_duration_seconds", run="/run") > 0
        [rec] = [r for r in _audit(m) if r["action"] == "drill"]
        assert rec["path"] == root and rec["detail"]["result"] == "passed"
        # No RUN_DIR: the config's [drill] runs, in the mount of its state dir (the timer's).
        rc, [again], err = drill("--config", str(cfg), "--state-dir", str(m.state_dir))
        assert rc == 0 and again["checkpoint"] == root, err


@pytest.mark.allow_log_warnings(FAILED)
def test_a_corrupted_bucket_object_fails_the_drill_loudly_while_the_local_copy_is_good(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str],
) -> None:
    url, prefix = remote
    payload = os.urandom(300_000)
    with mounted(tmp_path / "node", 1, _args(url, _config(tmp_path))) as m:
        run = m.mountpoint / "run"
        _saved(m, run, 1, payload)
        assert drill(str(run))[0] == 0
        cat = enc.open_catalog(m.state_dir)
        try:
            victim = sorted(enc.chunk_ids(cat, run / "checkpoint-1" / "model.safetensors"))[0]
        finally:
            cat.close()
        # Flip one byte of the bucket's copy (SeaweedFS's object), not of the local one.
        key = f"{prefix}/chunks/{victim}"
        body = bytearray(seaweed.get_object(key) or b"")
        body[-100] ^= 0x01
        seaweed.put_object(key, bytes(body))
        assert remote_objects(seaweed, prefix)[victim] == bytes(body)
        rc, [report], err = drill(str(run))
        assert rc == 1
        assert report["result"] == "failed" and victim in report["problems"][0]
        assert "WARNING" in err and "FAILED" in err and victim in err
        # The mount reads the good local copy: only the drill, reading as a new node, saw it.
        assert (run / "checkpoint-1" / "model.safetensors").read_bytes() == _st(payload)
        got = scrape(m.state_dir)
        assert sample(got, "ckptfs_drill_last_failed", run="/run") == 1
        assert sample(got, "ckptfs_drill_failures_total", run="/run") == 1
        assert _status(m)["drills"][0]["problem"].startswith(report["problems"][0][:40])
        assert f"{FAILED} /run FAILED" in m.log
        failed = [r for r in _audit(m) if r["action"] == "drill"][-1]
        assert failed["detail"]["result"] == "failed" and victim in failed["detail"]["problem"]


@pytest.mark.allow_log_warnings(FAILED)
@pytest.mark.allow_log_errors("is corrupt", "no valid copy")
def test_a_shredded_key_fails_the_drill(tmp_path: Path, remote: tuple[str, str]) -> None:
    url, _ = remote
    kek_path, _ = enc.kek_file(tmp_path / "keys" / "kek")
    cfg = enc.config(tmp_path / "ckptfs.toml", kek_path,
                     extra=f'[drill]\nscratch = "{tmp_path / "scratch"}"\n')
    with mounted(tmp_path / "node", 1, _args(url, cfg)) as m:
        (m.mountpoint / "proj-a").mkdir(mode=0o777, exist_ok=True)  # made at mount
        run = m.mountpoint / "proj-a" / "run"
        _saved(m, run, 1, os.urandom(300_000))
        rc, [report], err = drill(str(run))
        assert rc == 0, err  # the namespace's key opens every sealed chunk
        res = run_cli("shred", "/proj-a", "--yes", "--config", str(cfg), "--state-dir",
                      str(m.state_dir), "--timeout", "60", timeout=90)
        assert res.returncode == 0, res.stdout + res.stderr
        wait_until(lambda: "forgotten by this node" in m.log, what="the daemon drops the key")
        rc, [report], err = drill(str(run))
        assert rc == 1 and report["result"] == "failed"
        assert "key unavailable (missing or revoked)" in report["problems"][0]
        assert "FAILED" in err


OWNER, STRANGER, GROUP = 4201, 4202, 4302


@needs_root
@pytest.mark.allow_log_warnings(FAILED, "access refused")
def test_a_drill_reads_with_the_namespace_principal_and_no_other(
    tmp_path: Path, remote: tuple[str, str],
) -> None:
    url, _ = remote
    base = tmp_path / "node"
    base.mkdir()
    tmp_path.chmod(0o755)
    base.chmod(0o755)
    # mode 0755: the namespace's rule, not the mode bits, is what keeps a stranger out
    cfg = _config(tmp_path, f'[[namespace]]\npath = "/proj-a"\nuids = [{OWNER}]\nmode = "0755"\n'
                            f'[[namespace]]\npath = "/proj-b"\nuids = [{STRANGER}]\n'
                            f'gids = [{GROUP}]\n')
    with mounted(base, 1, _args(url, cfg)) as m:
        mp = m.mountpoint
        mp.chmod(0o777)
        files = {"config.json": b"{}", "model.safetensors": _st(b"x" * 5000),
                 "trainer_state.json": b'{"step": 1}'}
        assert as_user(mp, OWNER, OWNER, [
            "os.makedirs('proj-a/run/checkpoint-1')",
            *(f"open('proj-a/run/checkpoint-1/{n}', 'wb').write({data!r})"
              for n, data in files.items()),
        ]) == [0, 0, 0, 0]
        run = mp / "proj-a" / "run"
        wait_until(lambda: _state(m, "/proj-a/run/checkpoint-1") == "committed", what="commit")
        res = run_cli("sync", "--state-dir", str(m.state_dir), "--timeout", "60", timeout=90)
        assert res.returncode == 0, res.stdout + res.stderr
        # Root asks; the drill reads as the namespace's principal (its first uid).
        rc, [report], err = drill(str(run))
        assert rc == 0, err
        assert report["as"] == [OWNER, OWNER] and report["result"] == "passed"
        # Another namespace's principal may not read it: the drill fails, nothing read.
        rc, [report], err = drill("--as", f"{STRANGER}:{GROUP}", str(run))
        assert rc == 1 and report["bytes"] == 0
        assert "namespace /proj-a belongs to other users" in report["problems"][0]
        # Nor root: a drill only root could pass has proven nothing.
        rc, [report], _ = drill("--as", "0:0", str(run))
        assert rc == 1 and "may not read" in report["problems"][0]
        # A user asks on their own run directory, as themselves only; a stranger not at all.
        assert as_user(mp, OWNER, OWNER, [
            "os.setxattr('proj-a/run', 'user.ckptfs.drill', b'{\"as\": [0, 0]}')",
            "os.setxattr('proj-a/run', 'user.ckptfs.drill', b'{}'); "
            "assert b'passed' in os.getxattr('proj-a/run', 'user.ckptfs.drill')",
        ]) == [errno.EPERM, 0]
        assert as_user(mp, STRANGER, STRANGER, [
            "os.setxattr('proj-a/run', 'user.ckptfs.drill', b'{}')",
        ]) == [errno.EACCES]


# A writer in a process of its own (a fork of the test's process would close its copy of
# the descriptor at exec, and the kernel's FLUSH of that close commits the file).
WRITER = """
import json, os, struct, sys
f = open(sys.argv[1], "wb")
n = 300_000
h = json.dumps({"t": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
h += b" " * (-len(h) % 8)
f.write(struct.pack("<Q", len(h)) + h + os.urandom(n))
f.flush()
print("written", flush=True)
sys.stdin.readline()
f.close()
"""


def test_a_drill_waits_for_a_save_in_progress(tmp_path: Path, remote: tuple[str, str]) -> None:
    url, _ = remote
    with mounted(tmp_path / "node", 1, _args(url, _config(tmp_path))) as m:
        run = m.mountpoint / "run"
        _saved(m, run, 1, os.urandom(100_000))
        # A save writes: checkpoint-2's first file is open, a partial chunk of it in the
        # daemon's buffers.
        (run / "checkpoint-2").mkdir()
        writer = subprocess.Popen([sys.executable, "-c", WRITER,
                                   str(run / "checkpoint-2" / "model.safetensors")],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert writer.stdout is not None and writer.stdin is not None
            assert writer.stdout.readline().strip() == "written"
            proc = subprocess.Popen(ckptfs_cmd("drill", "--json", str(run)),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            wait_until(lambda: "drill of /run waits for a save in progress" in m.log,
                       what="the drill yields to the save")
            assert proc.poll() is None  # it waits for the save, not for time
            writer.stdin.write("close\n")
            writer.stdin.flush()
            assert writer.wait(timeout=60) == 0
        finally:
            if writer.poll() is None:
                writer.kill()
                writer.wait()
        for name, data in (("config.json", b"{}"), ("trainer_state.json", b'{"step": 2}')):
            (run / "checkpoint-2" / name).write_bytes(data)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        [report] = json.loads(out)
        assert report["waited_for_save"] is True and report["result"] == "passed"
        log = m.log
        assert log.index("waits for a save in progress") < log.index("restore drill of /run passed")
