"""The command line: --version, --help, config and argument errors, mount/umount edge cases.

Errors in config or arguments exit with 2 and one clear line on stderr naming the bad
key or value; no traceback ever reaches the operator.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from mountutil import (
    FUSE_AVAILABLE,
    SKIP_REASON,
    Mount,
    ckptfs_cmd,
    is_mounted,
    mounted,
    pid_alive,
    run_cli,
)

import ckptfs

needs_fuse = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)


def wait_until(cond, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


def assert_clean_error(
    res: subprocess.CompletedProcess[str], *needles: str, code: int | None = 2
) -> None:
    """Exit ``code`` (any non-zero if None), no traceback, and stderr names every needle."""
    if code is None:
        assert res.returncode != 0, f"expected failure, got 0; stdout={res.stdout!r}"
    else:
        assert res.returncode == code, (
            f"exit {res.returncode}, expected {code}; stderr={res.stderr!r}"
        )
    assert "Traceback" not in res.stderr + res.stdout, res.stderr
    assert res.stderr.strip(), "no message on stderr"
    for n in needles:
        assert n in res.stderr, f"{n!r} not named in stderr: {res.stderr!r}"


def assert_one_line(res: subprocess.CompletedProcess[str]) -> None:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one clear line on stderr, got {len(lines)}:\n{res.stderr}"


# --------------------------------------------------------------------------- version, help


def test_version() -> None:
    res = run_cli("--version")
    assert res.returncode == 0, res.stderr
    assert ckptfs.__version__ in res.stdout


def test_top_level_help_lists_subcommands() -> None:
    res = run_cli("--help")
    assert res.returncode == 0, res.stderr
    for sub in ("mount", "umount", "fsck"):
        assert sub in res.stdout


@pytest.mark.parametrize(
    ("sub", "options"),
    [
        ("mount", ["--config", "--state-dir", "--local", "--foreground", "--chunk-size"]),
        ("umount", []),
        ("fsck", ["--state-dir", "--repair"]),
    ],
)
def test_subcommand_help(sub: str, options: list[str]) -> None:
    res = run_cli(sub, "--help")
    assert res.returncode == 0, res.stderr
    assert "usage" in res.stdout.lower()
    for opt in options:
        assert opt in res.stdout, f"{sub} --help does not mention {opt}"
    if sub in ("mount", "umount"):
        assert "mountpoint" in res.stdout.lower()


def test_no_subcommand_is_an_error() -> None:
    res = run_cli()
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr


def test_unknown_subcommand() -> None:
    assert_clean_error(run_cli("frobnicate"), "frobnicate")


def test_unknown_option(tmp_path: Path) -> None:
    res = run_cli("mount", str(tmp_path), "--state-dir", str(tmp_path / "s"), "--bogus-flag")
    assert_clean_error(res, "--bogus-flag")


# --------------------------------------------------------------------------- bad config


BAD_CONFIGS = {
    "unknown_top": ('colour = "blue"\n', "colour"),
    "unknown_tier_key": (
        '[[tier]]\nname = "a"\nkind = "local"\npath = "/tmp/x"\nspeed = 9\n',
        "tier[0].speed",
    ),
    "relative_path": ('[[tier]]\nname = "a"\nkind = "local"\npath = "rel/dir"\n', "tier[0].path"),
    "bad_chunk_size": ('chunk_size = "lots"\n', "chunk_size"),
    "chunk_size_range": ("chunk_size = 1000\n", "chunk_size"),
    "bad_capacity": (
        '[[tier]]\nname = "a"\nkind = "local"\npath = "/tmp/x"\ncapacity = "huge"\n',
        "tier[0].capacity",
    ),
    "bad_kind": ('[[tier]]\nname = "a"\nkind = "tape"\npath = "/tmp/x"\n', "tier[0].kind"),
    "bad_io_threads": ("io_threads = 0\n", "io_threads"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
@pytest.mark.parametrize("sub", ["mount", "fsck"])
def test_bad_config_exit_2_names_key(tmp_path: Path, case: str, sub: str) -> None:
    text, key = BAD_CONFIGS[case]
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    state = tmp_path / "state"
    if sub == "mount":
        res = run_cli(
            "mount", str(mnt), "--config", str(cfg), "--state-dir", str(state), timeout=60
        )
    else:
        res = run_cli("fsck", "--config", str(cfg), "--state-dir", str(state), timeout=60)
        if res.returncode == 2 and "--config" in res.stderr and "unrecognized" in res.stderr:
            pytest.skip("fsck takes no --config")
    assert_clean_error(res, key)
    assert_one_line(res)
    assert not is_mounted(mnt)
    pidfile = state / "daemon.pid"
    if pidfile.exists():
        assert not pid_alive(int(pidfile.read_text().strip())), "a daemon started on a bad config"


def test_bad_toml_syntax(tmp_path: Path) -> None:
    cfg = tmp_path / "broken.toml"
    cfg.write_text("[[tier]\nname = \n")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    res = run_cli("mount", str(mnt), "--config", str(cfg), "--state-dir", str(tmp_path / "s"))
    assert_clean_error(res, str(cfg))
    assert_one_line(res)
    assert not is_mounted(mnt)


def test_missing_config_file(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    missing = tmp_path / "nope.toml"
    res = run_cli("mount", str(mnt), "--config", str(missing), "--state-dir", str(tmp_path / "s"))
    assert_clean_error(res, str(missing))
    assert_one_line(res)
    assert not is_mounted(mnt)


@pytest.mark.parametrize("value", ["3000", "lots", "128MiB", "-1"])
def test_bad_chunk_size_argument(tmp_path: Path, value: str) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    res = run_cli("mount", str(mnt), "--state-dir", str(tmp_path / "s"), "--chunk-size", value)
    assert_clean_error(res)
    assert "chunk_size" in res.stderr or "--chunk-size" in res.stderr, res.stderr
    assert not is_mounted(mnt)


# --------------------------------------------------------------------------- mount edge cases


@needs_fuse
def test_mount_nonexistent_mountpoint(tmp_path: Path) -> None:
    mnt = tmp_path / "does" / "not" / "exist"
    res = run_cli("mount", str(mnt), "--state-dir", str(tmp_path / "s"), timeout=60)
    assert_clean_error(res, str(mnt), code=None)
    assert not mnt.exists()
    pidfile = tmp_path / "s" / "daemon.pid"
    if pidfile.exists():
        assert not pid_alive(int(pidfile.read_text().strip()))


@needs_fuse
def test_mount_on_a_regular_file(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    res = run_cli("mount", str(f), "--state-dir", str(tmp_path / "s"), timeout=60)
    assert_clean_error(res, str(f), code=None)
    assert not is_mounted(f)


@needs_fuse
def test_embedded_default_tier(tmp_path: Path) -> None:
    state = tmp_path / "state"
    m = Mount(tmp_path / "mnt", state, [])
    try:
        m.start()
        assert is_mounted(m.mountpoint)
        pid = m.pid
        assert pid is not None and pid_alive(pid)
        assert (state / "ckptfs.log").exists()
        tier = state / "tiers" / "local0"
        assert tier.is_dir(), (
            "the embedded default tier was not created under STATE_DIR/tiers/local0"
        )
        data = os.urandom(300_000)
        (m.mountpoint / "hello.bin").write_bytes(data)
        chunks = [p for p in (tier / "chunks").rglob("*") if p.is_file()]
        assert chunks, "no chunk file under the default tier after close"
        assert all(len(p.name) == 64 and p.parent.name == p.name[:2] for p in chunks), chunks
        m.stop()
        assert not is_mounted(m.mountpoint)
        assert not pid_alive(pid), "umount returned before the daemon exited"
        m.start()
        assert (m.mountpoint / "hello.bin").read_bytes() == data
        m.stop()
        assert not [ln for ln in m.log.splitlines() if "ERROR" in ln or "Traceback" in ln], m.log
    finally:
        m.cleanup()


@needs_fuse
def test_pidfile_log_and_umount_waits(tmp_path: Path) -> None:
    with mounted(tmp_path, n_local=1) as m:
        pid = m.pid
        assert pid is not None and pid_alive(pid)
        assert m.log.strip(), "the daemon wrote nothing to STATE_DIR/ckptfs.log"
        (m.mountpoint / "f").write_bytes(b"x" * 5000)
        res = run_cli("umount", str(m.mountpoint))
        assert res.returncode == 0, res.stderr
        m._forget_pid()
        assert not is_mounted(m.mountpoint)
        assert not pid_alive(pid), "ckptfs umount returned while the daemon still ran"


@needs_fuse
def test_double_mount_refused(tmp_path: Path) -> None:
    with mounted(tmp_path, n_local=1) as m:
        (m.mountpoint / "f").write_bytes(b"first")
        other = tmp_path / "state2"
        res = run_cli(
            "mount", str(m.mountpoint), "--state-dir", str(other), "--local", str(tmp_path / "t2")
        )
        try:
            assert_clean_error(res, str(m.mountpoint), code=None)
        finally:
            pidfile = other / "daemon.pid"
            if res.returncode == 0 and pidfile.exists():
                # It wrongly mounted on top: take that mount down again.
                run_cli("umount", str(m.mountpoint))
        assert (m.mountpoint / "f").read_bytes() == b"first"


@needs_fuse
def test_same_state_dir_twice_refused(tmp_path: Path) -> None:
    """Two daemons on one catalog would corrupt it: the second mount must be refused."""
    with mounted(tmp_path, n_local=1) as m:
        mnt2 = tmp_path / "mnt2"
        mnt2.mkdir()
        res = run_cli("mount", str(mnt2), *m.args(), timeout=60)
        try:
            assert_clean_error(res, code=None)
        finally:
            if is_mounted(mnt2):
                run_cli("umount", str(mnt2))
        assert m.pid is not None and pid_alive(m.pid)
        assert int((m.state_dir / "daemon.pid").read_text()) == m.pid, "pid file overwritten"


@needs_fuse
def test_foreground_mount(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    state = tmp_path / "state"
    proc = subprocess.Popen(
        ckptfs_cmd(
            "mount",
            str(mnt),
            "--state-dir",
            str(state),
            "--local",
            str(tmp_path / "t0"),
            "--foreground",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: is_mounted(mnt) or proc.poll() is not None, 60, "the foreground mount")
        assert proc.poll() is None, (
            f"--foreground exited ({proc.returncode}): {proc.stderr.read() if proc.stderr else ''}"
        )
        (mnt / "fg.txt").write_text("foreground")
        assert (mnt / "fg.txt").read_text() == "foreground"
        # The daemon is our child here: until we reap it, it is a zombie. `umount` must
        # count a zombie as exited (it holds no fd, no lock) instead of waiting forever.
        res = run_cli("umount", str(mnt), "--timeout", "20", timeout=60)
        assert res.returncode == 0, res.stderr
        assert proc.wait(timeout=60) == 0
        assert not is_mounted(mnt)
    finally:
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@needs_fuse
def test_stale_mount_cleaned_by_next_mount(tmp_path: Path) -> None:
    """A supervisor remounts right after the daemon died: the dead mount must not block it.

    The kernel may still hold cached attributes of the mount root, so stat() can succeed
    for a moment after the kill; the mount command must detect the dead mount anyway.
    """
    with mounted(tmp_path, n_local=1) as m:
        (m.mountpoint / "kept").write_bytes(b"committed")
        os.stat(m.mountpoint)  # attributes of the root are now in the kernel's cache
        pid = m.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not pid_alive(pid), 30, "the daemon to die")
        m._forget_pid()
        m.start()
        assert (m.mountpoint / "kept").read_bytes() == b"committed"


def test_stale_mount_cleaned_once_detectable(tmp_path: Path) -> None:
    """The same once the kernel itself reports the dead connection (ENOTCONN/ECONNABORTED)."""
    with mounted(tmp_path, n_local=1) as m:
        (m.mountpoint / "kept").write_bytes(b"committed")
        pid = m.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not pid_alive(pid), 30, "the daemon to die")
        m._forget_pid()

        def dead() -> bool:
            try:
                os.stat(m.mountpoint)
            except OSError as e:
                assert e.errno in (errno.ENOTCONN, errno.ECONNABORTED), e
                return True
            return False

        wait_until(dead, 30, "stat() of the dead mount to fail")
        m.start()
        assert (m.mountpoint / "kept").read_bytes() == b"committed"


# --------------------------------------------------------------------------- umount, fsck


@needs_fuse
def test_umount_not_mounted(tmp_path: Path) -> None:
    d = tmp_path / "plain"
    d.mkdir()
    assert_clean_error(run_cli("umount", str(d)), str(d), code=None)


@needs_fuse
def test_umount_nonexistent(tmp_path: Path) -> None:
    d = tmp_path / "nothing"
    assert_clean_error(run_cli("umount", str(d)), str(d), code=None)


def test_umount_other_filesystem_refused() -> None:
    """umount only takes down ckptfs mounts, never e.g. /proc."""
    res = run_cli("umount", "/proc")
    assert_clean_error(res, "/proc", code=None)
    assert os.path.exists("/proc/self/stat")


def test_fsck_missing_state_dir(tmp_path: Path) -> None:
    missing = tmp_path / "nostate"
    res = run_cli("fsck", "--state-dir", str(missing))
    assert_clean_error(res, str(missing), code=None)
    assert not missing.exists(), "fsck created the state dir it was asked to check"


@needs_fuse
def test_fsck_clean_after_normal_use(tmp_path: Path) -> None:
    with mounted(tmp_path, n_local=2, extra_args=("--chunk-size", "1MiB")) as m:
        (m.mountpoint / "a").write_bytes(os.urandom(3 * 1024 * 1024 + 5))
        (m.mountpoint / "b").write_bytes(b"")
        (m.mountpoint / "a").rename(m.mountpoint / "c")
    res = run_cli("fsck", "--state-dir", str(tmp_path / "state"))
    assert res.returncode == 0, f"{res.returncode}\n{res.stdout}{res.stderr}"
    assert "Traceback" not in res.stderr
    res = run_cli("fsck", "--state-dir", str(tmp_path / "state"), "--repair")
    assert res.returncode == 0, f"{res.returncode}\n{res.stdout}{res.stderr}"
