"""Checkpoint awareness on real mounts: detection by the daemon, state as an xattr,
`ckptfs ls/show/latest/tag/verify/gc`, partial checkpoints, retention across tiers."""

from __future__ import annotations

import errno
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.catalog.test_catalog import make_v2
from tests.remote.test_remote_mount import MiB
from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON, mounted, run_cli, wait_until
from tests.support.s3server import OUTAGE_WARNINGS

from ckptfs.catalog.sql import SCHEMA_VERSION
from ckptfs.codec import frame

pytestmark = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)


def ls(path: Path) -> list[dict[str, Any]]:
    res = run_cli("ls", str(path), "--json")
    assert res.returncode == 0, res.stderr
    return list(json.loads(res.stdout))


def states(path: Path) -> dict[str, str]:
    return {c["root"]: c["state"] for c in ls(path)}


def hf_save(ckdir: Path, step: int, payload: bytes) -> None:
    """The file sequence of a Hugging Face Trainer save (docs/frameworks.md):
    trainer_state.json last."""
    d = ckdir / f"checkpoint-{step}"
    d.mkdir(parents=True)
    for name, data in (("config.json", b"{}"), ("model.safetensors", payload),
                       ("optimizer.pt", payload[::-1]), ("scheduler.pt", b"s"),
                       ("rng_state.pth", b"r"), ("trainer_state.json", json.dumps({"step": step}).encode())):
        with open(d / name, "wb") as f:
            f.write(data)


def test_a_state_dir_of_schema_2_mounts_with_its_checkpoints(ckpt_factory: Any) -> None:
    """A state dir whose catalog schema 2 made (no CHECK on checkpoint states) mounts; its
    checkpoints read as before and the catalog gains the CHECK."""
    m = ckpt_factory.mount()
    run = m.mountpoint / "run"
    hf_save(run, 1, b"w" * 10_000)
    wait_until(lambda: states(run).get("/run/checkpoint-1") == "committed", what="commit")
    before = ls(run)
    record = os.getxattr(run / "checkpoint-1", "user.ckptfs.checkpoint")
    m.stop()
    db = m.state_dir / "catalog.sqlite"
    make_v2(db)
    m.start()
    assert ls(run) == before
    assert os.getxattr(run / "checkpoint-1", "user.ckptfs.checkpoint") == record
    assert os.getxattr(run / "checkpoint-1", "user.ckptfs.state") == b"committed"
    hf_save(run, 2, b"v" * 10_000)
    wait_until(lambda: states(run).get("/run/checkpoint-2") == "committed", what="second commit")
    m.stop()
    conn = sqlite3.connect(db)
    try:
        version = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        assert version == (str(SCHEMA_VERSION),)  # migrated 2 -> 3 -> ... -> the current one
        sql = conn.execute("SELECT sql FROM sqlite_master WHERE name='checkpoints'").fetchone()[0]
        assert "CHECK (state IN (" in sql
    finally:
        conn.close()


def test_torch_save_is_detected_with_state_visible_in_the_mount(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    with mounted(tmp_path, 1, ("--chunk-size", "1MiB")) as m:
        run = m.mountpoint / "run"
        run.mkdir()
        torch.save({"w": torch.arange(300_000)}, run / "step-100.pt")
        wait_until(lambda: states(run).get("/run/step-100.pt") == "committed", what="commit")
        assert os.getxattr(run / "step-100.pt", "user.ckptfs.state") == b"committed"
        rec = json.loads(os.getxattr(run / "step-100.pt", "user.ckptfs.checkpoint"))
        assert rec["framework"] == "torch" and rec["step"] == 100
        [info] = ls(run)
        assert info["files"] == 1 and info["logical_bytes"] == (run / "step-100.pt").stat().st_size
        assert "local0" in info["durable_on"]


@pytest.mark.slow
@pytest.mark.allow_log_errors  # verify reads a chunk the test corrupts
@pytest.mark.allow_log_warnings("is partial")
def test_hf_checkpoints_latest_tag_verify_and_partial(tmp_path: Path) -> None:
    cfg = tmp_path / "ckptfs.toml"
    cfg.write_text('chunk_size = "1MiB"\ncheckpoint_partial_after = 0.5\n')
    with mounted(tmp_path, 1, ("--config", str(cfg))) as m:
        out = m.mountpoint / "job" / "out"
        payload = os.urandom(2 * MiB + 3)
        hf_save(out, 10, payload)
        wait_until(lambda: states(out).get("/job/out/checkpoint-10") == "committed", what="commit 10")
        res = run_cli("latest", str(out))
        assert res.returncode == 0 and res.stdout.strip() == str(out / "checkpoint-10"), res
        # A save whose writer dies: files but never trainer_state.json.
        d = out / "checkpoint-20"
        d.mkdir()
        (d / "model.safetensors").write_bytes(payload)
        wait_until(lambda: states(out).get("/job/out/checkpoint-20") == "partial", what="partial")
        assert run_cli("latest", str(out)).stdout.strip() == str(out / "checkpoint-10")
        assert os.getxattr(d, "user.ckptfs.state") == b"partial"
        # tag and show
        assert run_cli("tag", str(out / "checkpoint-10"), "milestone").returncode == 0
        shown = json.loads(run_cli("show", str(out / "checkpoint-10"), "--json").stdout)
        assert shown["tags"] == ["milestone"] and shown["step"] == 10 and shown["files"] == 6
        assert shown["write_s"] is not None and shown["write_s"] >= 0
        # verify reads it all back through the daemon's verified read path
        res = run_cli("verify", str(out / "checkpoint-10"))
        assert res.returncode == 0 and "verified" in res.stdout and "MB/s" in res.stdout, res
        m.stop()
        chunk = frame.digest_of(payload[:MiB]).hex()
        victim = next(p for p in (m.locals[0] / "chunks").glob("*/*") if p.name == chunk)
        raw = bytearray(victim.read_bytes())
        raw[frame.HEADER_SIZE + 10] ^= 1
        victim.write_bytes(bytes(raw))
        m.start()
        res = run_cli("verify", str(out / "checkpoint-10"))
        assert res.returncode == 1 and "model.safetensors" in res.stderr, res


def test_ls_outside_a_mount_is_a_clear_error(tmp_path: Path) -> None:
    res = run_cli("ls", str(tmp_path))
    assert res.returncode != 0 and "not inside a ckptfs mount" in res.stderr


@pytest.mark.slow
@pytest.mark.allow_log_warnings(*OUTAGE_WARNINGS)
def test_retention_over_twelve_steps_with_a_remote_outage(
    tmp_path: Path, seaweed: Any, remote: tuple[str, str]  # noqa: F811
) -> None:
    """keep_local 2, keep 3, a milestone every 4 steps; the remote is down for steps 5-8.
    After each step `ckptfs latest` is right; at the end the right checkpoints are on the
    right tiers, the rest are gone, and everything kept reads back exactly."""
    url, _ = remote
    cfg = tmp_path / "ckptfs.toml"
    cfg.write_text(
        'chunk_size = "1MiB"\n'
        '[[retention]]\npath = "/run"\nkeep_local = 2\nkeep = 3\nmilestone_every = 4\n'
        'skip_superseded_uploads = false\n'
    )
    payloads = {}
    with mounted(tmp_path, 1, ("--config", str(cfg), "--remote", url)) as m:
        run = m.mountpoint / "run"
        for step in range(1, 13):
            if step == 5:
                seaweed.stop()
            if step == 9:
                seaweed.start()
            payloads[step] = os.urandom(MiB + step)
            hf_save(run, step, payloads[step])
            root = f"/run/checkpoint-{step}"

            def committed(r: str = root) -> bool:
                return states(run).get(r) == "committed"

            wait_until(committed, what=f"commit {step}")
            assert run_cli("latest", str(run)).stdout.strip() == str(run / f"checkpoint-{step}")
        assert run_cli("sync", str(run), "--timeout", "120").returncode == 0
        res = run_cli("gc", str(run))
        assert res.returncode == 0, res.stderr
        by_root = {c["root"]: c for c in ls(run)}
        expired = {1, 2, 3, 5, 6, 7}
        for step in range(1, 13):
            c = by_root[f"/run/checkpoint-{step}"]
            if step in expired:
                assert c["state"] in ("expired", "deleted"), (step, c)
                assert not (run / f"checkpoint-{step}").exists()
                continue
            assert c["state"] == "committed", (step, c)
            assert (run / f"checkpoint-{step}" / "model.safetensors").read_bytes() == payloads[step]
            local = "local0" in c["durable_on"]
            assert "remote0" in c["durable_on"], (step, c)
            assert local == (step in (11, 12)), (step, c)  # the newest two stay local
        assert run_cli("latest", str(run)).stdout.strip() == str(run / "checkpoint-12")
        assert {c["state"] for c in by_root.values() if c["state"] != "committed"} <= {"deleted"}


DCP_SAVE = r"""
import os, sys
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp


def main(rank: int, world: int, path: str, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(rank)
    state = {f"w{rank}": torch.randn(256, 1024), "step": torch.tensor(5)}
    dcp.save(state, checkpoint_id=path)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(main, args=(2, sys.argv[1], sys.argv[2]), nprocs=2, join=True)
"""


@pytest.mark.slow
def test_torch_dcp_with_two_processes_and_safetensors_are_detected(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    import socket
    import subprocess
    import sys

    import torch

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    script = tmp_path / "dcp_save.py"
    script.write_text(DCP_SAVE)
    with mounted(tmp_path, 1, ("--chunk-size", "1MiB")) as m:
        run = m.mountpoint / "run"
        run.mkdir()
        res = subprocess.run([sys.executable, str(script), str(run / "step-5"), port],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        st.save_file({"t": torch.ones(1000)}, str(run / "model-7.safetensors"))
        got = wait_until(lambda: (lambda s: s if len(s) == 2 and set(s.values()) == {"committed"}
                                  else None)(states(run)), what="both commits")
        assert set(got) == {"/run/step-5", "/run/model-7.safetensors"}
        by_root = {c["root"]: c for c in ls(run)}
        assert by_root["/run/step-5"]["framework"] == "dcp"
        assert by_root["/run/step-5"]["files"] >= 3  # two ranks' .distcp and .metadata
        assert by_root["/run/model-7.safetensors"]["framework"] == "safetensors"


KILLED_SAVE = r"""
import os, sys, time
d = sys.argv[1]
os.makedirs(d)
for name in ("config.json", "model.safetensors"):
    with open(os.path.join(d, name), "wb") as f:
        f.write(os.urandom(300_000))
f = open(os.path.join(d, "optimizer.pt"), "wb")
f.write(os.urandom(100_000))
f.flush()
print("writing", flush=True)
time.sleep(600)  # killed here, mid-save: trainer_state.json never comes
"""


@pytest.mark.allow_log_warnings("is partial")
def test_a_writer_killed_mid_save_leaves_a_partial_checkpoint(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    cfg = tmp_path / "ckptfs.toml"
    cfg.write_text('chunk_size = "1MiB"\ncheckpoint_partial_after = 0.5\n')
    script = tmp_path / "killed_save.py"
    script.write_text(KILLED_SAVE)
    with mounted(tmp_path, 1, ("--config", str(cfg))) as m:
        out = m.mountpoint / "out"
        hf_save(out, 1, os.urandom(1000))
        proc = subprocess.Popen([sys.executable, str(script), str(out / "checkpoint-2")],
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
            wait_until(lambda: states(out).get("/out/checkpoint-2") == "writing", what="begin")
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        wait_until(lambda: states(out).get("/out/checkpoint-2") == "partial", what="partial")
        assert run_cli("latest", str(out)).stdout.strip() == str(out / "checkpoint-1")


def test_a_checkpoint_the_framework_rotates_away_is_deleted(tmp_path: Path) -> None:
    import shutil

    with mounted(tmp_path, 1, ("--chunk-size", "1MiB")) as m:
        out = m.mountpoint / "out"
        hf_save(out, 1, os.urandom(1000))
        hf_save(out, 2, os.urandom(1000))
        wait_until(lambda: states(out).get("/out/checkpoint-2") == "committed", what="commit")
        shutil.rmtree(out / "checkpoint-1")  # save_total_limit rotation
        wait_until(lambda: states(out).get("/out/checkpoint-1") == "deleted", what="deleted")
        assert states(out)["/out/checkpoint-2"] == "committed"


# -- a damaged copy found by a read or by fsck (issue 33, item 6) ---------------------------


def latest_of(run: Path) -> str:
    res = run_cli("latest", str(run))
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def missing_chunks(run: Path, root: str) -> int:
    return int(next(c for c in ls(run) if c["root"] == root)["missing_chunks"])


def two_checkpoints(run: Path) -> bytes:
    """checkpoint-1000 and checkpoint-1100 committed (no chunk shared); the newer one's
    model.safetensors."""
    hf_save(run, 1000, os.urandom(2 * MiB + 3))
    payload = os.urandom(2 * MiB + 5)
    hf_save(run, 1100, payload)
    wait_until(lambda: states(run).get("/run/checkpoint-1100") == "committed", what="commit")
    assert latest_of(run) == str(run / "checkpoint-1100")
    return payload


def flip_frame(tier: Path, digest: bytes) -> tuple[Path, bytes]:
    """Flip a payload byte of the frame of ``digest`` on a local tier; its path and old
    bytes."""
    victim = next(p for p in (tier / "chunks").glob("*/*") if p.name == digest.hex())
    old = victim.read_bytes()
    raw = bytearray(old)
    raw[frame.HEADER_SIZE + 10] ^= 1
    victim.write_bytes(bytes(raw))
    return victim, old


@pytest.mark.allow_log_errors  # the reads of the damaged chunk
def test_a_read_that_finds_the_only_copy_bad_takes_the_checkpoint_out_of_latest(
    tmp_path: Path,
) -> None:
    with mounted(tmp_path, 1, ("--chunk-size", "1MiB")) as m:
        run = m.mountpoint / "run"
        payload = two_checkpoints(run)
        m.stop()
        digest = frame.digest_of(payload[:MiB])
        victim, good = flip_frame(m.locals[0], digest)
        m.start()
        model = run / "checkpoint-1100" / "model.safetensors"
        with pytest.raises(OSError) as exc:
            model.read_bytes()
        assert exc.value.errno == errno.EIO
        # The read recorded the copy bad: no copy of that chunk is left.
        assert latest_of(run) == str(run / "checkpoint-1000")
        assert missing_chunks(run, "/run/checkpoint-1100") == 1
        assert missing_chunks(run, "/run/checkpoint-1000") == 0
        assert run_cli("verify", str(run / "checkpoint-1100")).returncode == 1
        # The copy comes back intact (a disk that was away): a read finds it valid again.
        m.stop()
        victim.write_bytes(good)
        m.start()
        assert model.read_bytes() == payload
        assert latest_of(run) == str(run / "checkpoint-1100")
        assert missing_chunks(run, "/run/checkpoint-1100") == 0


def test_fsck_verify_records_a_bad_copy_and_a_valid_one_again(tmp_path: Path) -> None:
    with mounted(tmp_path, 1, ("--chunk-size", "1MiB")) as m:
        run = m.mountpoint / "run"
        payload = two_checkpoints(run)
        m.stop()
        digest = frame.digest_of(payload[MiB : 2 * MiB])
        victim, good = flip_frame(m.locals[0], digest)
        res = run_cli("fsck", "--state-dir", str(m.state_dir), "--verify")
        assert res.returncode == 1 and f"corrupt chunk {digest.hex()[:16]}" in res.stdout, res
        assert "1 copy(ies) recorded bad" in res.stdout, res.stdout
        m.start()
        # Nothing read it since: the catalog knows from fsck.
        assert latest_of(run) == str(run / "checkpoint-1000")
        assert missing_chunks(run, "/run/checkpoint-1100") == 1
        m.stop()
        victim.write_bytes(good)
        res = run_cli("fsck", "--state-dir", str(m.state_dir), "--verify")
        assert res.returncode == 0 and "recorded valid again" in res.stdout, res
        m.start()
        assert latest_of(run) == str(run / "checkpoint-1100")
