"""The drill's systemd units (systemd/ckptfs-drill.service and .timer): what they depend
on, and `systemd-analyze verify` (skipped where it is missing)."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CKPTFS_BIN = Path(sys.executable).parent / "ckptfs"


def unit(name: str) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string((ROOT / "systemd" / name).read_text())
    return cp


def test_the_drill_units_ask_the_running_daemon_on_a_schedule() -> None:
    svc = unit("ckptfs-drill.service")
    assert svc["Service"]["Type"] == "oneshot"
    assert svc["Service"]["ExecStart"].split()[1:3] == ["drill", "--config"]
    # The mount's config, the one ckptfs.service mounts with (its [drill] runs).
    mount = unit("ckptfs.service")["Service"]["ExecStart"]
    assert svc["Service"]["ExecStart"].split()[-1] in mount.split()
    assert svc["Unit"]["Requisite"] == svc["Unit"]["After"] == "ckptfs.service"
    timer = unit("ckptfs-drill.timer")
    assert timer["Timer"]["Unit"] == "ckptfs-drill.service"
    assert timer["Timer"]["OnCalendar"] and timer["Timer"]["Persistent"] == "true"
    assert timer["Install"]["WantedBy"] == "timers.target"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed here")
def test_the_drill_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    assert CKPTFS_BIN.exists(), CKPTFS_BIN
    for name in ("ckptfs.service", "ckptfs-drill.service", "ckptfs-drill.timer"):
        text = (ROOT / "systemd" / name).read_text()
        (tmp_path / name).write_text(text.replace("/usr/local/bin/ckptfs", str(CKPTFS_BIN)))
    for name in ("ckptfs-drill.service", "ckptfs-drill.timer"):
        res = subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp_path / name)],
                             capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert res.returncode == 0, f"{name}: {res.stderr}"
        assert name not in res.stderr, f"{name}: warnings:\n{res.stderr}"
