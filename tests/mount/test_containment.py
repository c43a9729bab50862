"""No user stops the daemon (issue 33; docs/concurrency.md "No user stops the daemon"):
an unexpected error in a FUSE request handler fails that request with EIO; one in a
background service or task is logged, counted and the service restarted, and `ckptfs
status` (and its JSON) says which service is degraded. The errors are injected into a real
mount through ``CKPTFS_TEST_FAULTS`` (ckptfs/supervise.py), each raised once."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.mount.test_checkpoints import hf_save, states
from tests.support.mountutil import (
    FUSE_AVAILABLE,
    SKIP_REASON,
    mounted,
    pid_alive,
    run_cli,
    wait_until,
)

pytestmark = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)

# The services and tasks a mount with two local tiers runs (daemon/services.py running, ChunkStore).
LOCAL_SERVICES = ("uploader", "deleter", "auditor", "tracker", "janitor", "telemetry",
                  "copy-backs", "sync-behind")


def services(mnt: Path) -> dict[str, dict[str, Any]]:
    res = run_cli("status", str(mnt), "--json")
    assert res.returncode == 0, res.stderr
    return {x["name"]: x for x in json.loads(res.stdout)["services"]}


@pytest.mark.allow_log_errors  # the injected faults are logged as ERROR with a traceback
def test_an_unexpected_error_in_a_request_fails_it_with_eio_and_the_mount_stays(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPTFS_TEST_FAULTS", "fuse.mkdir,fuse.getxattr")
    with mounted(tmp_path) as m:
        with pytest.raises(OSError) as info:
            (m.mountpoint / "d").mkdir()
        assert info.value.errno == errno.EIO
        with pytest.raises(OSError) as info:
            os.getxattr(m.mountpoint, "user.x")
        assert info.value.errno == errno.EIO
        (m.mountpoint / "d").mkdir()  # the next request is served
        (m.mountpoint / "d" / "f").write_bytes(b"x" * 1000)
        assert (m.mountpoint / "d" / "f").read_bytes() == b"x" * 1000
        assert m.pid is not None and pid_alive(m.pid)
        assert "unexpected error in mkdir" in m.log
        assert "unexpected error in getxattr" in m.log


@pytest.mark.allow_log_errors  # the injected faults are logged as ERROR with a traceback
def test_an_unexpected_error_in_each_background_service_is_contained_and_shown(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPTFS_TEST_FAULTS", ",".join(LOCAL_SERVICES))
    cfg = tmp_path / "ckptfs.toml"
    cfg.write_text('chunk_size = "1MiB"\nwrite_behind = "always"\n')  # sync-behind tasks run
    with mounted(tmp_path, 2, ("--config", str(cfg))) as m:
        run = m.mountpoint / "run"
        hf_save(run, 1, os.urandom(3 << 20))  # work for the tracker, the stores, the auditor
        with open(run / "checkpoint-1" / "model.safetensors", "rb") as f:
            os.fsync(f.fileno())
        wait_until(lambda: states(run).get("/run/checkpoint-1") == "committed",
                   what="the checkpoint committed by the restarted tracker")
        got = wait_until(lambda: (lambda s: s if set(LOCAL_SERVICES) <= set(s) else None)(
            services(m.mountpoint)), what="every service's fault in status")
        for name in LOCAL_SERVICES:
            assert got[name]["state"] == "degraded", got[name]
            assert got[name]["errors"] == 1
            assert "InjectedFault" in got[name]["last_error"]
        text = run_cli("status", str(m.mountpoint)).stdout
        assert "service tracker: degraded, 1 unexpected error(s)" in text
        # Still serving, and the services work again: a second save commits.
        hf_save(run, 2, b"y" * 10_000)
        wait_until(lambda: states(run).get("/run/checkpoint-2") == "committed", what="commit 2")
        assert m.pid is not None and pid_alive(m.pid)


@pytest.mark.allow_log_errors  # the injected fault is logged as ERROR with a traceback
def test_an_unexpected_error_in_a_chunk_write_fails_that_file_not_the_daemon(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A chunk write runs on the mount's nursery, beside the request that filled the chunk:
    # a bug there fails that version of the file with EIO (nothing committed).
    monkeypatch.setenv("CKPTFS_TEST_FAULTS", "chunk-write")
    cfg = tmp_path / "ckptfs.toml"
    cfg.write_text('chunk_size = "1MiB"\n')
    with mounted(tmp_path, 2, ("--config", str(cfg))) as m:
        path = m.mountpoint / "a.bin"
        with pytest.raises(OSError) as info:
            path.write_bytes(os.urandom(3 << 20))
        assert info.value.errno == errno.EIO
        assert path.read_bytes() == b""  # a new file: nothing of the failed version
        data = os.urandom(3 << 20)
        path.write_bytes(data)
        assert path.read_bytes() == data
        got = wait_until(lambda: services(m.mountpoint).get("chunk-write"),
                         what="the fault in status")
        assert got["state"] == "degraded" and got["errors"] == 1
        assert m.pid is not None and pid_alive(m.pid)
