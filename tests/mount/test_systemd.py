"""Running ckptfs as a service and through mount(8).

* The unit files pass `systemd-analyze verify` (skipped where systemd-analyze is missing)
  and keep the settings the service depends on.
* A daemon started the way the unit starts it (`ckptfs mount --foreground`, NOTIFY_SOCKET
  and WATCHDOG_USEC given by the test) says READY=1 only once the mount answers, pings the
  watchdog, says STOPPING=1 on SIGTERM, unmounts cleanly and loses nothing.
* The mount helper `scripts/mount.fuse.ckptfs` (what `mount -t fuse.ckptfs` and the
  documented /etc/fstab line run) mounts, refuses bad options, and `umount` stops it.
"""

from __future__ import annotations

import configparser
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.mountutil import (
    FUSE_AVAILABLE,
    SKIP_REASON,
    Mount,
    ckptfs_cmd,
    is_mounted,
    pid_alive,
    run_cli,
)

from ckptfs.statedir import wait_unlocked

ROOT = Path(__file__).resolve().parents[2]
UNITS = ("ckptfs.service", "ckptfs@.service")
HELPER = ROOT / "scripts" / "mount.fuse.ckptfs"
CKPTFS_BIN = Path(sys.executable).parent / "ckptfs"
needs_fuse = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)


# ------------------------------------------------------------------------------ unit files


def unit(name: str) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string((ROOT / "systemd" / name).read_text())
    return cp


@pytest.mark.parametrize("name", UNITS)
def test_unit_keeps_what_the_service_depends_on(name: str) -> None:
    u = unit(name)
    svc = u["Service"]
    assert svc["Type"] == "notify" and svc["NotifyAccess"] == "main"
    assert "--foreground" in svc["ExecStart"] and " mount " in svc["ExecStart"]
    assert " umount " in svc["ExecStop"]
    assert svc["Restart"] == "on-failure"
    assert int(svc["LimitNOFILE"]) >= 65536
    assert int(svc["WatchdogSec"]) > 0
    assert int(svc["TimeoutStopSec"]) > int(re.search(r"--timeout (\d+)", svc["ExecStop"]).group(1))  # type: ignore[union-attr]
    after = u["Unit"]["After"].split()
    assert "network-online.target" in after and "local-fs.target" in after
    # Restarted for as long as a start fails (a database down at boot), never given up.
    assert u["Unit"]["StartLimitIntervalSec"] == "0"
    # Options that give the daemon a mount namespace of its own would hide the mount.
    for key in ("PrivateTmp", "ProtectSystem", "ProtectHome", "PrivateDevices",
                "ProtectKernelTunables", "ProtectControlGroups", "PrivateMounts",
                "ReadOnlyPaths", "MountFlags", "ProtectClock", "DevicePolicy"):
        assert key not in svc, f"{key} breaks a FUSE mount"
    assert svc["NoNewPrivileges"] == "yes"
    assert "CAP_SYS_ADMIN" in svc["CapabilityBoundingSet"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed here")
def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    # verify checks that ExecStart's program exists: point it at this checkout's ckptfs.
    assert CKPTFS_BIN.exists(), CKPTFS_BIN
    for name in UNITS:
        text = (ROOT / "systemd" / name).read_text()
        (tmp_path / name).write_text(text.replace("/usr/local/bin/ckptfs", str(CKPTFS_BIN)))
    (tmp_path / "ckptfs@scratch-ckpt.service").symlink_to(tmp_path / "ckptfs@.service")
    for name in (*UNITS, "ckptfs@scratch-ckpt.service"):
        res = subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp_path / name)],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, f"{name}: {res.stderr}"
        assert name not in res.stderr, f"{name}: warnings:\n{res.stderr}"


# ------------------------------------------------------------------------------ sd_notify


def test_notify_without_a_socket_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from ckptfs import service

    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert service.notify("READY=1") is False
    monkeypatch.setenv("WATCHDOG_USEC", "4000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert service.watchdog_interval() is None  # meant for another process
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert service.watchdog_interval() == 2.0


class NotifySocket:
    """The service manager's end of NOTIFY_SOCKET: a unix datagram socket."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.messages: list[dict[str, str]] = []

    def next(self, timeout: float) -> dict[str, str] | None:
        self.sock.settimeout(max(0.01, timeout))
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return None
        msg = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
        self.messages.append(msg)
        return msg

    def wait_for(self, key: str, timeout: float, proc: subprocess.Popen[bytes]) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no {key} within {timeout} s; got {self.messages}"
            assert proc.poll() is None or key == "STOPPING", f"daemon exited: {proc.returncode}"
            msg = self.next(min(left, 0.5))
            if msg is not None and key in msg:
                return msg

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[NotifySocket]:
    s = NotifySocket(tmp_path / "notify.sock")
    try:
        yield s
    finally:
        s.close()


@needs_fuse
def test_foreground_daemon_under_notify_ready_watchdog_and_sigterm(
    tmp_path: Path, notify_socket: NotifySocket
) -> None:
    mnt, state, tier = tmp_path / "mnt", tmp_path / "state", tmp_path / "tier0"
    mnt.mkdir()
    tier.mkdir()
    env = dict(os.environ, NOTIFY_SOCKET=str(notify_socket.path), WATCHDOG_USEC="300000")
    env.pop("WATCHDOG_PID", None)
    log = open(tmp_path / "stderr.log", "wb")  # noqa: SIM115
    m = Mount(mnt, state, [tier], ("--chunk-size", "256KiB", "--metrics-address", "127.0.0.1:0"))
    proc = subprocess.Popen(
        ckptfs_cmd("mount", str(mnt), *m.args(), "--foreground"),
        env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
    )
    m._started.append(proc.pid)
    try:
        ready = notify_socket.wait_for("READY", 60, proc)
        # Right when READY arrives the mount is there and answers.
        assert is_mounted(mnt), "READY=1 before the mount exists"
        os.statvfs(mnt)
        assert os.listdir(mnt) == []
        assert ready["READY"] == "1" and str(mnt) in ready.get("STATUS", "")
        assert not any("READY" in msg for msg in notify_socket.messages[:-1])
        for _ in range(2):  # pings every WATCHDOG_USEC / 2
            assert notify_socket.wait_for("WATCHDOG", 10, proc)["WATCHDOG"] == "1"

        closed = os.urandom(3 * 256 * 1024 + 11)
        (mnt / "closed.bin").write_bytes(closed)
        still_open = os.urandom(256 * 1024 + 5)
        fd = os.open(mnt / "open.bin", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(fd, still_open)  # written, never closed when the stop comes
            proc.send_signal(signal.SIGTERM)
            stopping = notify_socket.wait_for("STOPPING", 30, proc)
            assert stopping["STOPPING"] == "1"
            assert proc.wait(timeout=120) == 0
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)  # the mount is gone: the kernel may refuse
        m._started.remove(proc.pid)
        assert not is_mounted(mnt), "still mounted after SIGTERM"
        assert not (state / "daemon.pid").exists()
        assert wait_unlocked(state, 10)
        # Nothing lost: remount (as the unit would after a restart) and read both back.
        m.extra_args = ("--chunk-size", "256KiB")
        m.start()
        try:
            assert (mnt / "closed.bin").read_bytes() == closed
            assert (mnt / "open.bin").read_bytes() == still_open
        finally:
            m.stop()
        res = run_cli("fsck", "--state-dir", str(state))
        assert res.returncode == 0 and "fsck: clean" in res.stdout, res.stdout + res.stderr
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        m.cleanup()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    text = (tmp_path / "stderr.log").read_text(errors="replace")
    assert "Traceback" not in text and " ERROR " not in text, text


# ------------------------------------------------------------------------------ mount helper


def helper(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(HELPER), *args], capture_output=True, text=True, timeout=120,
                          env=env or dict(os.environ, CKPTFS=str(CKPTFS_BIN)))


def documented_fstab_line() -> list[str]:
    text = (ROOT / "docs" / "operations.md").read_text()
    lines = [ln.split() for ln in text.splitlines() if re.match(r"^ckptfs:\S+\s+\S+\s+fuse\.ckptfs\s", ln)]
    assert lines, "no fstab line (ckptfs:STATE_DIR MOUNTPOINT fuse.ckptfs ...) in docs/operations.md"
    return lines[0]


@needs_fuse
def test_documented_fstab_line_mounts_through_the_helper(tmp_path: Path) -> None:
    source, mountpoint, fstype, options, _dump, _pass = documented_fstab_line()
    assert fstype == "fuse.ckptfs"
    state, mnt, tier = tmp_path / "state", tmp_path / "mnt", tmp_path / "t0"
    mnt.mkdir()
    tier.mkdir()
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'chunk_size = "256KiB"\nmetrics_address = ""\n[[tier]]\nname = "nvme0"\n'
                   f'kind = "local"\npath = "{tier}"\n')
    # The documented line, with this test's paths for the state dir, mount point and config.
    state_doc = source.split(":", 1)[1]
    config_doc = re.search(r"config=([^,]+)", options).group(1)  # type: ignore[union-attr]
    opts = options.replace(config_doc, str(cfg))
    m = Mount(mnt, state, [tier])
    try:
        assert mountpoint.startswith("/")
        res = helper(source.replace(state_doc, str(state)), str(mnt), "-o", opts)
        assert res.returncode == 0, res.stdout + res.stderr
        m.pid = int((state / "daemon.pid").read_text())
        m._started.append(m.pid)
        # /proc/mounts shows the same source as the fstab line: `mount -a` sees it mounted.
        with open("/proc/mounts") as f:
            found = [ln.split()[:3] for ln in f if ln.split()[1] == str(mnt)]
        assert found == [[f"ckptfs:{state}", str(mnt), "fuse.ckptfs"]]
        (mnt / "x").write_bytes(b"through fstab")
        assert (mnt / "x").read_bytes() == b"through fstab"
        assert list((tier / "chunks").glob("*/*")), "the config's tier was not used"
        # A plain umount(8), as at shutdown: the daemon commits, unmounts and exits.
        res2 = subprocess.run(["umount", str(mnt)], capture_output=True, text=True, timeout=60)
        assert res2.returncode == 0, res2.stderr
        assert wait_unlocked(state, 60)
        deadline = time.monotonic() + 30
        while pid_alive(m.pid) and time.monotonic() < deadline:
            time.sleep(0.05)  # polling the daemon's exit, with a deadline
        assert not pid_alive(m.pid)
        m._started.clear()
    finally:
        m.cleanup()


@needs_fuse
# The remount from the state dir alone gets the default chunk size: the daemon keeps the
# catalog's and says so.
@pytest.mark.allow_log_warnings("differs from")
def test_helper_options_and_sources(tmp_path: Path) -> None:
    state, mnt, tier = tmp_path / "state", tmp_path / "mnt", tmp_path / "t0"
    mnt.mkdir()
    tier.mkdir()
    m = Mount(mnt, state, [tier])
    try:
        res = helper(f"ckptfs:{state}", str(mnt), "-o",
                     f"rw,nofail,_netdev,x-systemd.requires=network-online.target,local={tier},"
                     "chunk_size=256KiB,metrics_address=127.0.0.1:0", "-n")
        assert res.returncode == 0, res.stdout + res.stderr
        m.pid = int((state / "daemon.pid").read_text())
        m._started.append(m.pid)
        assert is_mounted(mnt)
        assert (state / "metrics.addr").exists()
        (mnt / "f").write_bytes(b"1" * 300_000)
        m.stop()
        # A state dir as SOURCE: the recorded tiers come back.
        res = helper(str(state), str(mnt), "-o", "metrics_address=")
        assert res.returncode == 0, res.stdout + res.stderr
        m.pid = int((state / "daemon.pid").read_text())
        m._started.append(m.pid)
        assert (mnt / "f").read_bytes() == b"1" * 300_000
        m.stop()
    finally:
        m.cleanup()
    for bad, needle in ((("-o", "ro"), "read-only"), (("-o", "bogus=1"), "unknown option: bogus=1"),
                        (("-N", "x"), "namespaces")):
        res = helper(f"ckptfs:{state}", str(mnt), *bad)
        assert res.returncode == 1 and needle in res.stderr, res.stderr
        assert not is_mounted(mnt)
    res = helper("relative/dir", str(mnt))
    assert res.returncode == 1 and "SOURCE" in res.stderr, res.stderr
    # -f (fake): mount(8) asks for everything but the mount itself.
    res = helper(f"ckptfs:{state}", str(mnt), "-f", "-o", f"local={tier}")
    assert res.returncode == 0 and not is_mounted(mnt), res.stderr


# ------------------------------------------------------------------------------ logs


def test_logs_never_carry_credentials() -> None:
    from ckptfs.logsetup import redact

    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    for line in (
        f"aws_secret_access_key={secret}",
        f"{{'SecretAccessKey': '{secret}'}}",
        f"session_token: {secret}",
        f"GET https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F2024&X-Amz-Signature={secret}",
        f"Authorization: AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/x, Signature={secret}",
        f"endpoint http://admin:{secret}@127.0.0.1:8333 refused",
    ):
        out = redact(line)
        assert secret not in out and "***" in out, out
    assert "AKIAIOSFODNN7EXAMPLE" not in redact("key id AKIAIOSFODNN7EXAMPLE")
    plain = "chunk 0123abcd on tier local0 is corrupt: digest mismatch"
    assert redact(plain) == plain


def test_log_lines_carry_levels_for_journald_and_json() -> None:
    import json
    import logging

    from ckptfs.logsetup import JournalFormatter, JsonFormatter

    rec = logging.LogRecord("ckptfs.upload", logging.WARNING, __file__, 1,
                            "upload to tier %s failed: password=%s", ("r0", "hunter2"), None)
    line = JournalFormatter("%(name)s: %(message)s").format(rec)
    assert line == "<4>ckptfs.upload: upload to tier r0 failed: password=***"
    entry = json.loads(JsonFormatter().format(rec))
    assert entry["level"] == "WARNING" and entry["logger"] == "ckptfs.upload"
    assert entry["message"] == "upload to tier r0 failed: password=***"
