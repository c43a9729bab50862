"""The commit protocol under kill -9 (docs/semantics.md, "The commit protocol").

For each framework layout of tests/compat, the daemon kills itself (a named crash point,
``CKPTFS_TEST_CRASH_AT``, ckptfs/crashpoint.py) at the step of the commit signal (its
transaction committed, the application not yet answered) and at the steps after it (the
application answered, the tracker not told; the tracker told, the replay point not moved).
After the remount the checkpoint is committed, `ckptfs latest` names it, retention keeps it,
and every byte reads back as written. Before the replay of commit signals (cd16a72) such a
checkpoint stayed `writing`, turned `partial` and retention deleted it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.mount.test_checkpoints import states
from tests.support.mountutil import (
    FUSE_AVAILABLE,
    SKIP_REASON,
    Mount,
    pid_alive,
    run_cli,
    wait_until,
)

pytestmark = [
    pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON),
    # The remount cleans up the dead mount and says the signal was replayed.
    pytest.mark.allow_log_warnings("cleaning up stale mount", "commit signal was replayed"),
]

ZIP = b"PK\x03\x04" + os.urandom(300_000) + b"PK\x05\x06" + bytes(18)  # a torch.save-like zip


@dataclass(frozen=True)
class Layout:
    """A framework's save: ``files`` writes everything before the commit signal, ``signal``
    makes it; ``root`` is the checkpoint (inside the mount), ``ends`` what the crash
    point's path ends with (the signal's file or rename target)."""

    name: str
    files: Callable[[Path, dict[Path, bytes]], None]
    signal: Callable[[Path, dict[Path, bytes]], None]
    root: str
    ends: str


def put(path: Path, data: bytes, written: dict[Path, bytes]) -> None:
    with open(path, "wb") as f:
        f.write(data)
    written[path] = data


def rename(src: Path, dst: Path, written: dict[Path, bytes]) -> None:
    try:
        os.rename(src, dst)
    finally:  # also when the daemon died after the rename's transaction (rename-committed)
        for p in [p for p in written if p == src or src in p.parents]:
            written[dst / p.relative_to(src)] = written.pop(p)


def hf_files(run: Path, d: str, w: dict[Path, bytes]) -> None:
    (run / d).mkdir(parents=True)
    for name in ("model.safetensors", "optimizer.pt"):
        put(run / d / name, os.urandom(3 * 1024 * 1024 + 17), w)
    put(run / d / "rng_state.pth", ZIP, w)


def hf_state(path: Path, w: dict[Path, bytes]) -> None:
    put(path, json.dumps({"global_step": 801}).encode(), w)


def hf_tmp_files(run: Path, w: dict[Path, bytes]) -> None:
    hf_files(run, "tmp-checkpoint-801", w)
    hf_state(run / "tmp-checkpoint-801" / "trainer_state.json", w)


def dcp_files(run: Path, w: dict[Path, bytes]) -> None:
    d = run / "step-5"
    d.mkdir(parents=True)
    put(d / "__0_0.distcp", os.urandom(2 * 1024 * 1024), w)
    put(d / "__1_0.distcp", os.urandom(2 * 1024 * 1024 + 5), w)
    put(d / ".metadata.tmp", os.urandom(5000), w)


def deepspeed_files(run: Path, w: dict[Path, bytes]) -> None:
    d = run / "global_step30"
    d.mkdir(parents=True)
    put(d / "mp_rank_00_model_states.pt", ZIP, w)
    put(d / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", ZIP, w)


def lightning_files(run: Path, w: dict[Path, bytes]) -> None:
    run.mkdir(parents=True)
    put(run / "epoch=1-step=200.ckpt.tmp", ZIP, w)  # fsspec's temp, renamed onto the name


def megatron_files(run: Path, w: dict[Path, bytes]) -> None:
    d = run / "iter_0000050"
    d.mkdir(parents=True)
    put(d / "__0_0.distcp", os.urandom(1024 * 1024), w)
    put(d / ".metadata.tmp", b"meta", w)
    rename(d / ".metadata.tmp", d / ".metadata", w)
    put(d / "metadata.json", b"{}", w)


def orbax_files(run: Path, w: dict[Path, bytes]) -> None:
    tmp = run / "40.orbax-checkpoint-tmp"
    (tmp / "default").mkdir(parents=True)
    put(tmp / "_CHECKPOINT_METADATA", b"{}", w)
    put(tmp / "default" / "d", os.urandom(1024 * 1024 + 3), w)
    put(tmp / "commit_success.txt", b"ok", w)


LAYOUTS = [
    Layout("hf", lambda r, w: hf_files(r, "checkpoint-801", w),
           lambda r, w: hf_state(r / "checkpoint-801" / "trainer_state.json", w),
           "/run/checkpoint-801", "/trainer_state.json"),
    Layout("hf-tmp-rename", hf_tmp_files,
           lambda r, w: rename(r / "tmp-checkpoint-801", r / "checkpoint-801", w),
           "/run/checkpoint-801", "/run/checkpoint-801"),
    Layout("dcp", dcp_files,
           lambda r, w: rename(r / "step-5" / ".metadata.tmp", r / "step-5" / ".metadata", w),
           "/run/step-5", "/step-5/.metadata"),
    Layout("deepspeed", deepspeed_files, lambda r, w: put(r / "latest", b"global_step30", w),
           "/run/global_step30", "/run/latest"),
    Layout("lightning", lightning_files,
           lambda r, w: rename(r / "epoch=1-step=200.ckpt.tmp", r / "epoch=1-step=200.ckpt", w),
           "/run/epoch=1-step=200.ckpt", "/run/epoch=1-step=200.ckpt"),
    Layout("megatron", megatron_files,
           lambda r, w: put(r / "latest_checkpointed_iteration.txt", b"50", w),
           "/run/iter_0000050", "/latest_checkpointed_iteration.txt"),
    Layout("orbax", orbax_files,
           lambda r, w: rename(r / "40.orbax-checkpoint-tmp", r / "40", w),
           "/run/40", "/run/40"),
]
RENAMES = {"hf-tmp-rename", "dcp", "lightning", "orbax"}

CONFIG = """
chunk_size = "1MiB"
checkpoint_partial_after = 0.5

[[retention]]
path = "/run"
keep = 1
keep_local = 1
"""


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Mount]:
    """A mount not started yet (one local tier, the config above); cleaned up at the end."""
    (tmp_path / "tier0").mkdir()
    cfg = tmp_path / "ckptfs.toml"
    cfg.write_text(CONFIG)
    m = Mount(tmp_path / "mnt", tmp_path / "state", [tmp_path / "tier0"],
              ("--config", str(cfg)))
    try:
        yield m
    finally:
        m.cleanup()


def save_and_crash(m: Mount, layout: Layout, step: str, monkeypatch: pytest.MonkeyPatch
                   ) -> dict[Path, bytes]:
    """Mount with the crash point armed, save ``layout`` through it; return once the daemon
    is dead. Returns the bytes of every file as the application wrote it."""
    with monkeypatch.context() as env:
        env.setenv("CKPTFS_TEST_CRASH_AT", f"{step}:{layout.ends}")
        m.start()
    written: dict[Path, bytes] = {}
    run = m.mountpoint / "run"
    layout.files(run, written)
    before_reply = step.endswith("-committed")
    try:
        layout.signal(run, written)
    except OSError:
        # The daemon died inside the signal's call: the application got an error.
        assert before_reply, f"the signal failed at step {step}"
    else:
        assert not before_reply, "the daemon answered the signal it was to die in"
    pid = m.pid
    assert pid is not None
    wait_until(lambda: not pid_alive(pid), timeout=60, what=f"the daemon's crash at {step}")
    m.crashed()
    return written


def check_committed_after_remount(m: Mount, layout: Layout, written: dict[Path, bytes]) -> None:
    m.start()
    run = m.mountpoint / "run"
    # Waits while the row is `writing` (partial after 0.5 s: a lost signal never commits).
    wait_until(lambda: states(run).get(layout.root) == "committed", timeout=30,
               what=f"{layout.root} committed after the remount")
    res = run_cli("gc", str(run))  # retention keep = 1: the newest committed stays
    assert res.returncode == 0, res.stderr
    assert states(run).get(layout.root) == "committed"
    latest = run_cli("latest", str(run))
    assert latest.returncode == 0, latest.stderr
    assert latest.stdout.strip() == str(m.mountpoint) + layout.root
    for path, data in written.items():
        assert path.read_bytes() == data, path
    m.stop()


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.name)
@pytest.mark.parametrize("when", ["signal", "after-reply"])
def test_a_crash_at_the_commit_signal_keeps_the_checkpoint(
    node: Mount, layout: Layout, when: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if when == "signal":  # its transaction committed, the application not answered
        step = "rename-committed" if layout.name in RENAMES else "close-committed"
    else:  # the application answered, the tracker got the event and recorded nothing
        step = "tracker-received"
    written = save_and_crash(node, layout, step, monkeypatch)
    check_committed_after_remount(node, layout, written)


@pytest.mark.parametrize("layout", [LAYOUTS[0], LAYOUTS[2]], ids=lambda x: x.name)
def test_a_crash_after_the_tracker_recorded_replays_harmlessly(
    node: Mount, layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recorded, but the replay point had not moved past it: the remount replays the
    signal again, which changes nothing (the row stays committed, no second commit)."""
    written = save_and_crash(node, layout, "tracker-recorded", monkeypatch)
    check_committed_after_remount(node, layout, written)
    # Committed before the crash: the replay found it committed and recorded nothing.
    assert f"checkpoint {layout.root}: its commit signal was replayed" not in node.log


def test_a_rename_the_tracker_never_saw_moves_the_rows_after_the_remount(
    node: Mount, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint written under a temp directory name, then renamed: killed as the rename
    returns, the rows must follow the rename (before: `ckptfs ls` listed the vanished
    `.tmp` path as committed with 0 files)."""
    def files(r: Path, w: dict[Path, bytes]) -> None:
        (r / "checkpoint-7.tmp").mkdir(parents=True)
        put(r / "checkpoint-7.tmp" / "model.pt", ZIP, w)

    layout = Layout(
        "tmp-dir", files,
        lambda r, w: rename(r / "checkpoint-7.tmp", r / "checkpoint-7", w),
        "/run/checkpoint-7/model.pt", "/run/checkpoint-7")
    with monkeypatch.context() as env:
        env.setenv("CKPTFS_TEST_CRASH_AT", "tracker-received:/run/checkpoint-7")
        node.start()
    run = node.mountpoint / "run"
    written: dict[Path, bytes] = {}
    layout.files(run, written)
    wait_until(lambda: states(run).get("/run/checkpoint-7.tmp/model.pt") == "committed",
               what="the torch.save file committed under its temp directory")
    layout.signal(run, written)
    pid = node.pid
    assert pid is not None
    wait_until(lambda: not pid_alive(pid), timeout=60, what="the crash after the rename")
    node.crashed()
    node.start()
    wait_until(lambda: states(run).get(layout.root) == "committed", what="the rows moved")
    assert not [r for r in states(run) if ".tmp" in r], states(run)
    assert (run / "checkpoint-7" / "model.pt").read_bytes() == ZIP
    node.stop()
