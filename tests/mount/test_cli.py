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

from tests.support.mountutil import (
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
    assert_clean_error(res, str(mnt), "does not exist", code=2)
    assert not mnt.exists()
    pidfile = tmp_path / "s" / "daemon.pid"
    if pidfile.exists():
        assert not pid_alive(int(pidfile.read_text().strip()))


@needs_fuse
def test_mount_on_a_regular_file(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    res = run_cli("mount", str(f), "--state-dir", str(tmp_path / "s"), timeout=60)
    assert_clean_error(res, str(f), "not a directory", code=2)
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
            assert_clean_error(res, str(m.mountpoint), "already a mount point", code=2)
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
            assert_clean_error(res, str(m.state_dir), "in use", f"pid {m.pid}", code=2)
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
            "--create",
            "--foreground",
            "--metrics-address",  # a free port: 9464 may be taken here
            "127.0.0.1:0",
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
@pytest.mark.allow_log_warnings("cleaning up stale mount")
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


@pytest.mark.allow_log_warnings("cleaning up stale mount")
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
    assert_clean_error(run_cli("umount", str(d)), str(d), code=2)


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


# --------------------------------------------------------------------------- refusals (exit 2)


def refused(res: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit 2, one clear line naming every needle, no traceback."""
    assert_clean_error(res, *needles, code=2)
    assert_one_line(res)


@needs_fuse
def test_missing_tier_directory_refused_unless_create(tmp_path: Path) -> None:
    """An unmounted NVMe: its mount point directory (or a path below it) is missing. The
    mount is refused rather than fill the disk below; ``create = true`` opts in."""
    mnt, state = tmp_path / "mnt", tmp_path / "state"
    mnt.mkdir()
    gone = tmp_path / "nvme1" / "ckptfs"
    res = run_cli("mount", str(mnt), "--state-dir", str(state), "--local", str(gone))
    refused(res, "--local", str(gone), "does not exist", "--create")
    cfg = tmp_path / "ckptfs.toml"
    text = f'metrics_address = ""\n[[tier]]\nname = "nvme1"\nkind = "local"\npath = "{gone}"\n'
    cfg.write_text(text)
    res = run_cli("mount", str(mnt), "--config", str(cfg), "--state-dir", str(state))
    refused(res, "tier[0].path", str(gone), "tier[0].create = true")
    assert not gone.exists() and not is_mounted(mnt)
    cfg.write_text(text + "create = true\n")
    m = Mount(mnt, state, [], ("--config", str(cfg)))
    try:
        m.start()
        (mnt / "f").write_bytes(os.urandom(300_000))
        assert gone.is_dir() and gone.stat().st_mode & 0o777 == 0o700
        assert list((gone / "chunks").glob("*/*")), "no chunk on the created tier"
        m.stop()
        # The device is gone again: a remount with the recorded tiers is refused too.
        for p in sorted(gone.rglob("*"), reverse=True):
            p.rmdir() if p.is_dir() else p.unlink()
        gone.rmdir()
        res = run_cli("mount", str(mnt), "--state-dir", str(state), "--metrics-address", "")
        refused(res, "tier nvme1 (recorded in the catalog)", str(gone), "--create")
        assert not is_mounted(mnt)
    finally:
        m.cleanup()


@needs_fuse
def test_tiers_on_one_device_refused_unless_allowed_and_shown_in_status(tmp_path: Path) -> None:
    import json

    base = tmp_path / "refuse"
    (base / "mnt").mkdir(parents=True)
    for d in ("a", "b"):
        (base / d).mkdir()
    res = run_cli("mount", str(base / "mnt"), "--state-dir", str(base / "state"),
                  "--local", str(base / "a"), "--local", str(base / "b"), "--metrics-address", "")
    refused(res, "--local", str(base / "a"), "same device as tier local1", "--allow-shared-device")
    assert not is_mounted(base / "mnt")
    with mounted(tmp_path, n_local=2) as m:  # Mount passes --allow-shared-device
        st = json.loads(run_cli("status", str(m.mountpoint), "--json").stdout)
        assert {t["name"]: t["shares_device_with"] for t in st["tiers"]} == {
            "local0": ["local1"], "local1": ["local0"]}
        plain = run_cli("status", str(m.mountpoint)).stdout
        assert "tier local0: " in plain and "shares its device with local1" in plain, plain
        m.stop()
        # The allowance is recorded: a remount with only --state-dir keeps it.
        res = run_cli("mount", str(m.mountpoint), "--state-dir", str(m.state_dir),
                      "--metrics-address", "")
        assert res.returncode == 0, res.stderr
        m.pid = int((m.state_dir / "daemon.pid").read_text())
        m._started.append(m.pid)
        m.stop()


@needs_fuse
def test_nonempty_mountpoint_refused_unless_nonempty(tmp_path: Path) -> None:
    mnt, state = tmp_path / "mnt", tmp_path / "state"
    mnt.mkdir()
    (mnt / "precious").write_text("kept")
    res = run_cli("mount", str(mnt), "--state-dir", str(state), "--metrics-address", "")
    refused(res, str(mnt), "not empty", "precious", "--nonempty")
    assert not is_mounted(mnt)
    m = Mount(mnt, state, [], ("--nonempty", "--metrics-address", ""))
    try:
        m.start()
        assert not (mnt / "precious").exists()  # hidden by the mount
        (mnt / "new").write_bytes(b"x")
        m.stop()
        assert (mnt / "precious").read_text() == "kept"
    finally:
        m.cleanup()


@needs_fuse
def test_fsck_on_a_mounted_state_dir_exit_2(tmp_path: Path) -> None:
    with mounted(tmp_path, n_local=1) as m:
        res = run_cli("fsck", "--state-dir", str(m.state_dir))
        refused(res, str(m.state_dir), "in use", f"pid {m.pid}")


@needs_fuse
@pytest.mark.allow_log_errors  # "mount refused: ... does not exist"
def test_missing_bucket_refused_exit_2(tmp_path: Path, seaweed, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    from tests.support.s3server import ACCESS_KEY, SECRET_KEY

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    url = f"s3://no-such-bucket-ckptfs/p?endpoint={seaweed.endpoint}"
    res = run_cli("mount", str(mnt), "--state-dir", str(tmp_path / "state"), "--remote", url,
                  "--metrics-address", "")
    refused(res, "remote0", "'no-such-bucket-ckptfs' does not exist")
    assert not is_mounted(mnt)


@needs_fuse
@pytest.mark.allow_log_errors  # "mount refused: ... cannot write"
def test_read_only_credentials_refused_exit_2(tmp_path: Path, seaweed, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Credentials that may read and list but not write (the server's reader identity):
    the write probe at mount finds it; nothing is left under the prefix."""
    import uuid

    from tests.support.s3server import READER_ACCESS_KEY, READER_SECRET_KEY

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", READER_ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", READER_SECRET_KEY)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    prefix = f"ro-{uuid.uuid4().hex[:8]}"
    url = f"s3://{seaweed.bucket}/{prefix}?endpoint={seaweed.endpoint}"
    res = run_cli("mount", str(mnt), "--state-dir", str(tmp_path / "state"), "--remote", url,
                  "--metrics-address", "")
    refused(res, "remote0", f"can read s3://{seaweed.bucket}/{prefix} but not write")
    assert not is_mounted(mnt)
    client = seaweed.client()
    try:
        listed = client.list_objects_v2(Bucket=seaweed.bucket, Prefix=prefix + "/")
    finally:
        client.close()
    assert not listed.get("Contents"), "the probe (or anything) was left in the bucket"


@needs_fuse
@pytest.mark.allow_log_warnings("is taken (another daemon?)")
def test_metrics_port_taken_serves_on_a_free_port(tmp_path: Path) -> None:
    import json
    import socket
    import urllib.request

    from tests.support.mountutil import wait_until as wait_for

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        wanted = f"127.0.0.1:{port}"
        with mounted(tmp_path, n_local=1, extra_args=("--metrics-address", wanted)) as m:
            def served() -> dict[str, object] | None:
                st = json.loads(run_cli("status", str(m.mountpoint), "--json").stdout)
                return st if st["metrics"] else None

            st = wait_for(served, 30, "status naming the metrics address")
            assert st["metrics"] != wanted and str(st["metrics"]).startswith("127.0.0.1:")
            assert st["metrics_requested"] == wanted
            assert (m.state_dir / "metrics.addr").read_text().strip() == st["metrics"]
            with urllib.request.urlopen(str(st["metrics_url"]), timeout=10) as resp:
                assert b"ckptfs_info" in resp.read()
            assert f"port {port} on 127.0.0.1 is taken" in m.log
            plain = run_cli("status", str(m.mountpoint)).stdout
            assert f"metrics: {st['metrics_url']} ({wanted} was taken)" in plain, plain


# --------------------------------------------------------------------------- private state


def _modes(state: Path) -> dict[str, int]:
    return {str(p.relative_to(state)) or ".": p.stat().st_mode & 0o777
            for p in [state, *state.iterdir()]}


@needs_fuse
def test_state_dir_and_chunk_dirs_are_private_whatever_the_umask(tmp_path: Path) -> None:
    state = tmp_path / "state"
    m = Mount(tmp_path / "mnt", state, [])  # the embedded default tier, in the state dir
    old = os.umask(0)  # the CLI and the daemon inherit it: modes must not depend on it
    try:
        m.start()
        (m.mountpoint / "a.bin").write_bytes(os.urandom(600_000))
        wait_until(lambda: (state / "stats.json").exists() and (state / "metrics.addr").exists(),
                   30, "stats.json and metrics.addr")
        modes = _modes(state)
        for name in ("catalog.sqlite", "catalog.sqlite-wal", "catalog.sqlite-shm",
                     "ckptfs.log", "stats.json", "daemon.pid", "lock", "metrics.addr"):
            assert modes.get(name) == 0o600, (name, oct(modes.get(name, 0)), modes)
        assert modes["."] == 0o700 and modes["tiers"] == 0o700, modes
        tier = state / "tiers" / "local0"
        dirs = [tier, tier / "chunks", tier / "tmp", *(tier / "chunks").iterdir()]
        assert len(dirs) > 3
        assert all(d.stat().st_mode & 0o777 == 0o700 for d in dirs), [
            (str(d), oct(d.stat().st_mode)) for d in dirs]
        m.stop()
        # A state dir from an older version (0755, files 0644): fixed at mount, and logged.
        os.chmod(state, 0o755)
        for p in state.iterdir():
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        sub = next((tier / "chunks").iterdir())
        os.chmod(sub, 0o755)
        m.start()
        modes = _modes(state)
        assert modes["."] == 0o700 and modes["tiers"] == 0o700
        assert all(v == 0o600 for k, v in modes.items() if (state / k).is_file()), modes
        assert sub.stat().st_mode & 0o777 == 0o700
        fixed = [ln for ln in m.log.splitlines() if "made private" in ln]
        assert len(fixed) == 1 and " INFO " in fixed[0], fixed
        assert ". 0755->0700" in fixed[0] and "catalog.sqlite 0644->0600" in fixed[0], fixed
        m.stop()
    finally:
        os.umask(old)
        m.cleanup()


# --------------------------------------------------------------------------- control xattrs


USER = 4242  # no such user needed: a uid that is not root and not the owner


def as_user(uid: int, path: Path, name: str, value: bytes = b"1") -> int:
    """setxattr in a child process that dropped to ``uid`` (for gc, then the getxattr
    that waits for the pass); returns 0 or the errno."""
    pid = os.fork()
    if pid == 0:  # the child: only syscalls, then _exit
        code = 0
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.setxattr(path, name, value)
            if name == "user.ckptfs.gc":
                os.getxattr(path, name)  # returns when the pass is done
        except OSError as exc:
            code = exc.errno or 1
        except BaseException:
            code = 250
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.slow
@needs_fuse
def test_control_xattrs_only_for_the_owner_and_gc_only_under_path(tmp_path: Path) -> None:
    """On an allow_other mount, a user who owns one run directory may apply retention to
    it, but not to another user's run, and may not tag what it does not own."""
    import json
    import shutil
    import tempfile

    from tests.mount.test_checkpoints import hf_save
    from tests.support.mountutil import wait_until as wait_for

    max_age = 6.0
    cfg = tmp_path / "ckptfs.toml"
    cfg.write_text('chunk_size = "256KiB"\nallow_other = true\nmetrics_address = "127.0.0.1:0"\n'
                   f'[[retention]]\npath = "/*"\nkeep = 5\nmax_age = {max_age}\n')
    # The mount point must be reachable by USER: not under pytest's 0700 tmp dirs.
    top = Path(tempfile.mkdtemp(prefix="ckptfs-ctl-", dir="/tmp"))
    os.chmod(top, 0o755)
    tier = tmp_path / "tier0"
    tier.mkdir()
    m = Mount(top / "mnt", tmp_path / "state", [tier], ("--config", str(cfg)))
    try:
        m.start()
        mine, theirs = m.mountpoint / "run_b", m.mountpoint / "run_a"
        for run in (theirs, mine):
            run.mkdir()
            os.chmod(run, 0o777)  # anyone may write here: the owner check is what refuses
        os.chown(mine, USER, USER)
        for step in (1, 2):
            for run in (theirs, mine):
                hf_save(run, step, os.urandom(50_000))
        os.chmod(theirs / "checkpoint-2", 0o777)
        os.chmod(mine / "checkpoint-1", 0o777)
        os.chown(mine / "checkpoint-2", USER, USER)

        def states() -> dict[str, str]:
            res = run_cli("ls", str(m.mountpoint), "--json")
            return {c["root"]: c["state"] for c in json.loads(res.stdout)} if res.returncode == 0 else {}

        wait_for(lambda: list(states().values()) == ["committed"] * 4, 30, "four commits")
        rows = json.loads(run_cli("ls", str(m.mountpoint), "--json").stdout)
        assert len(rows) == 4
        newest_one = max(json.loads(os.getxattr(r["path"], "user.ckptfs.checkpoint"))["commit_ns"]
                         for r in rows if r["root"].endswith("checkpoint-1"))
        # Old enough to expire now, but no commit comes to start a retention pass.
        wait_for(lambda: time.time_ns() - newest_one > (max_age + 0.5) * 1e9, max_age + 10,
                 "the first checkpoints to pass max_age")

        assert as_user(USER, theirs, "user.ckptfs.gc") == errno.EPERM
        assert as_user(USER, theirs / "checkpoint-2", "user.ckptfs.tag", b"milestone") == errno.EPERM
        assert as_user(USER, mine / "checkpoint-1", "user.ckptfs.tag", b"milestone") == errno.EPERM
        assert as_user(USER, mine / "checkpoint-2", "user.ckptfs.tag", b"milestone") == 0
        assert states() == {f"/{r}/checkpoint-{s}": "committed"
                            for r in ("run_a", "run_b") for s in (1, 2)}, "a refused request acted"
        assert as_user(USER, mine, "user.ckptfs.gc") == 0  # returns when the pass is done
        after = states()
        assert after["/run_b/checkpoint-1"] in ("expired", "deleted"), after
        assert after["/run_a/checkpoint-1"] == "committed", "gc under run_b expired run_a's"
        assert after["/run_a/checkpoint-2"] == after["/run_b/checkpoint-2"] == "committed"
        # `ckptfs gc PATH` (root here) applies retention under PATH only, too.
        res = run_cli("gc", str(theirs / "checkpoint-2"))
        assert res.returncode == 0, res.stderr
        assert states()["/run_a/checkpoint-1"] == "committed"
        res = run_cli("gc", str(theirs))
        assert res.returncode == 0, res.stderr
        assert states()["/run_a/checkpoint-1"] in ("expired", "deleted"), res.stdout
        assert "/run_a/checkpoint-1: committed -> " in res.stdout, res.stdout
        m.stop()
        assert not [ln for ln in m.log.splitlines() if "ERROR" in ln or "Traceback" in ln], m.log
    finally:
        m.cleanup()
        shutil.rmtree(top, ignore_errors=True)


@needs_fuse
@pytest.mark.allow_log_warnings("could not report to the command that started this daemon")
def test_a_daemon_whose_starting_command_went_away_keeps_serving(tmp_path: Path) -> None:
    """Issue 33, item 5: `ckptfs mount` gave up waiting (its readiness pipe closed), the
    daemon then reported ready into the closed pipe, died on BrokenPipeError and left the
    mount point answering ECONNABORTED. It serves, and says it could not report."""
    tier = tmp_path / "tier0"
    tier.mkdir()
    m = Mount(tmp_path / "mnt", tmp_path / "state", [tier])
    m.mountpoint.mkdir()
    r, w = os.pipe()
    os.close(r)  # the starting command is gone before the daemon reports
    try:
        proc = subprocess.Popen(
            ckptfs_cmd("mount", str(m.mountpoint), "--foreground", "--ready-fd", str(w),
                       *m.args()),
            pass_fds=(w,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True,
        )
        m.pid = proc.pid
        m._started.append(proc.pid)
        os.close(w)
        wait_until(lambda: "could not report to the command" in m.log or proc.poll() is not None,
                 timeout=60, what="the daemon's report")
        assert proc.poll() is None, f"the daemon exited ({proc.returncode}):\n{m.log}"
        (m.mountpoint / "f").write_bytes(b"served")
        assert (m.mountpoint / "f").read_bytes() == b"served"
        m.stop()
        assert proc.wait(timeout=30) == 0
    finally:
        m.cleanup()
