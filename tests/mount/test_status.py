"""`ckptfs status [PATH] [--json] [--watch]` on real mounts: the JSON checked against the
catalog, the plain lines a pipe gets, the rich screen a terminal gets (in a pty), --watch
ending cleanly on Ctrl-C, and status of a state dir whose daemon is not running."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.mountutil import (
    FUSE_AVAILABLE,
    SKIP_REASON,
    Mount,
    ckptfs_cmd,
    mounted,
    run_cli,
    wait_until,
)

from ckptfs.catalog import SqliteCatalog

pytestmark = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)
CHUNK = 256 * 1024


def hf_save(run: Path, step: int, size: int) -> None:
    d = run / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(os.urandom(size))
    (d / "config.json").write_bytes(b"{}")
    (d / "trainer_state.json").write_bytes(json.dumps({"global_step": step}).encode())


def states(path: Path) -> dict[str, str]:
    res = run_cli("ls", str(path), "--json")
    assert res.returncode == 0, res.stderr
    return {c["root"]: c["state"] for c in json.loads(res.stdout)}


def status_json(*args: str) -> dict[str, Any]:
    res = run_cli("status", *args, "--json")
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout))


def config(tmp_path: Path) -> Path:
    cfg = tmp_path / "ckptfs.toml"
    cfg.write_text('chunk_size = "256KiB"\nmetrics_address = "127.0.0.1:0"\n')
    return cfg


@pytest.fixture
def saved(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A mount with four checkpoints in run /a and one in run /b, all committed."""
    with mounted(tmp_path, 2, ("--config", str(config(tmp_path)))) as m:
        for step in (1, 2, 3, 4):
            hf_save(m.mountpoint / "a", step, CHUNK * step + 5)
        hf_save(m.mountpoint / "b", 10, 3 * CHUNK)
        want = {f"/a/checkpoint-{s}" for s in (1, 2, 3, 4)} | {"/b/checkpoint-10"}
        wait_until(lambda: all(v == "committed" for v in states(m.mountpoint).values())
                   and set(states(m.mountpoint)) == want, what="five commits")
        yield m


def test_status_json_matches_the_catalog(saved: Mount) -> None:
    m = saved
    s = wait_until(lambda: (lambda d: d if d["checkpoint_states"] else None)(
        status_json(str(m.mountpoint))), what="live checkpoint facts")
    assert s["state_dir"] == str(m.state_dir) and s["mountpoint"] == str(m.mountpoint)
    assert s["daemon"] == {"running": True, "pid": m.pid, "stats_age_s": s["daemon"]["stats_age_s"]}
    assert s["daemon"]["stats_age_s"] < 10
    addr = (m.state_dir / "metrics.addr").read_text().strip()
    assert s["metrics"] == addr and s["metrics_url"] == f"http://{addr}/metrics"
    assert s["backlog"] is None  # no remote tier
    cat = SqliteCatalog(m.state_dir / "catalog.sqlite", readonly=True)
    try:
        recorded = cat.recorded_tiers()
        rows = [r.as_dict() for r in cat.checkpoint_rows("/")]
    finally:
        cat.close()
    assert [t["name"] for t in s["tiers"]] == [t["name"] for t in recorded]
    for t, d in zip(s["tiers"], m.locals, strict=True):
        assert t["location"] == str(d) and t["state"] == "healthy"
        st = os.statvfs(d)
        assert t["capacity"]["total"] == st.f_blocks * st.f_frsize
        assert t["capacity"]["used"] == sum(p.stat().st_size for p in (d / "chunks").glob("*/*"))
    assert sum(t["write_bytes"] for t in s["tiers"]) >= sum(CHUNK * k + 5 for k in (1, 2, 3, 4))
    assert s["checkpoint_states"] == {"committed": 5}
    # The latest three checkpoints per run, newest first, as the catalog and `ls` have them.
    listed = {c["root"]: c for c in json.loads(run_cli("ls", str(m.mountpoint), "--json").stdout)}
    by_run = {r["run"]: r for r in s["runs"]}
    assert set(by_run) == {"/a", "/b"}
    assert by_run["/a"]["checkpoints"] == 4
    assert [c["root"] for c in by_run["/a"]["latest"]] == [f"/a/checkpoint-{k}" for k in (4, 3, 2)]
    assert [c["root"] for c in by_run["/b"]["latest"]] == ["/b/checkpoint-10"]
    catalog_rows = {r["root"]: r for r in rows}
    for run in s["runs"]:
        assert run["remote_durable"] is None
        for c in run["latest"]:
            row = catalog_rows[c["root"]]
            assert (c["state"], c["step"], c["framework"]) == (row["state"], row["step"], row["framework"])
            assert c["commit_ns"] == row["commit_ns"] and c["begin_ns"] == row["begin_ns"]
            for key in ("files", "logical_bytes", "durable_on", "write_s", "completion_skew_s"):
                assert c[key] == listed[c["root"]][key], key
            assert c["path"] == str(m.mountpoint) + c["root"]
    assert by_run["/a"]["latest"][0]["logical_bytes"] == CHUNK * 4 + 5 + 2 + len(
        json.dumps({"global_step": 4}))


def test_plain_status_in_a_pipe(saved: Mount) -> None:
    m = saved
    res = run_cli("status", str(m.mountpoint))
    assert res.returncode == 0, res.stderr
    out = res.stdout
    addr = (m.state_dir / "metrics.addr").read_text().strip()
    assert "\x1b[" not in out, "colour codes in a pipe"
    for needle in (f"state dir: {m.state_dir}", f"mounted at: {m.mountpoint}",
                   "tier local0: local", "healthy", "capacity ", "% full",
                   "backlog: none", "checkpoints in /a: /a/checkpoint-4 (committed, step 4",
                   "checkpoints in /b: /b/checkpoint-10", f"metrics: http://{addr}/metrics"):
        assert needle in out, f"{needle!r} not in:\n{out}"


def run_in_pty(args: list[str], until: Callable[[str], bool], timeout: float = 30,
               interrupt: bool = False) -> tuple[int, str]:
    """Run ``ckptfs ARGS`` on a 140x50 terminal; read until ``until(screen)``; then (with
    ``interrupt``) send SIGINT as Ctrl-C would. Returns (exit code, everything printed)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 140, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen(ckptfs_cmd(*args), stdin=slave, stdout=slave, stderr=slave,
                            env=env, start_new_session=True)
    os.close(slave)
    out = b""
    try:
        deadline = time.monotonic() + timeout
        while not until(out.decode(errors="replace")):
            left = deadline - time.monotonic()
            assert left > 0, f"screen not shown in {timeout} s:\n{out.decode(errors='replace')}"
            if select.select([master], [], [], left)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
        if interrupt:
            os.kill(proc.pid, signal.SIGINT)
        # Drain until the child exits (a pty blocks a writer whose output nobody reads).
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                with contextlib.suppress(OSError):
                    out += os.read(master, 65536)
        code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return code, out.decode(errors="replace")


def test_rich_screen_on_a_terminal(saved: Mount) -> None:
    m = saved
    addr = (m.state_dir / "metrics.addr").read_text().strip()
    code, out = run_in_pty(["status", str(m.mountpoint)], until=lambda s: False)
    assert code == 0, out
    for needle in ("tiers", "upload backlog", "latest checkpoints", "checkpoint-4",
                   "checkpoint-10", "local0", "local1", "healthy", f"http://{addr}/metrics",
                   "━", "% of"):
        assert needle in out, f"{needle!r} not on the screen:\n{out}"
    assert "\x1b[" in out, "no colour on a terminal"
    assert "checkpoint-1 " not in out  # only the latest three of run /a


def test_watch_redraws_until_ctrl_c(saved: Mount) -> None:
    m = saved
    # Two screens drawn (the header printed twice in the redraws), then Ctrl-C: exit 0.
    code, out = run_in_pty(["status", str(m.mountpoint), "--watch"],
                           until=lambda s: s.count("upload backlog") >= 2, interrupt=True)
    assert code == 0, out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_json_watch_prints_a_line_a_second_until_ctrl_c(saved: Mount, inherited: str) -> None:
    # "ignored": started from a shell that ignores SIGINT for background jobs (nohup,
    # `cmd &`): Ctrl-C must still end --watch.
    m = saved
    proc = subprocess.Popen(ckptfs_cmd("status", str(m.mountpoint), "--json", "--watch"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_ignore_sigint if inherited == "ignored" else None)
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        second = json.loads(proc.stdout.readline())
        assert first["mountpoint"] == second["mountpoint"] == str(m.mountpoint)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_status_of_a_stopped_daemon(tmp_path: Path) -> None:
    with mounted(tmp_path, 1, ("--config", str(config(tmp_path)))) as m:
        hf_save(m.mountpoint / "r", 5, CHUNK)
        wait_until(lambda: states(m.mountpoint).get("/r/checkpoint-5") == "committed",
                   what="commit")
        m.stop()
        s = status_json("--state-dir", str(m.state_dir))
        assert s["daemon"]["running"] is False and s["metrics"] is None
        assert s["mountpoint"] is None
        st = os.statvfs(m.locals[0])
        assert s["tiers"][0]["capacity"]["total"] == st.f_blocks * st.f_frsize
        assert [c["root"] for c in s["runs"][0]["latest"]] == ["/r/checkpoint-5"]
        out = run_cli("status", "--state-dir", str(m.state_dir)).stdout
        assert "daemon: not running" in out and "metrics:" not in out, out
