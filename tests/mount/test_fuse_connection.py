"""The mount raises the kernel's limits on read requests in flight (fuse/conn.py): several
readers' read-ahead then goes out at once instead of queueing behind libfuse's 12."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.mountutil import Mount

from ckptfs.fuse.conn import CONGESTION_THRESHOLD, CONNECTIONS, MAX_BACKGROUND, tune_connection


@pytest.fixture
def fusectl() -> Iterator[Path]:
    """fusectl at its usual place (systemd mounts it at boot; mounted here if it is not,
    and unmounted again)."""
    if os.geteuid() != 0:
        pytest.skip("the kernel's FUSE connection files need root")
    mounted_here = False
    if not os.path.ismount(CONNECTIONS):
        r = subprocess.run(["mount", "-t", "fusectl", "fusectl", str(CONNECTIONS)],
                           capture_output=True, text=True, check=False)
        if r.returncode != 0:
            pytest.skip(f"cannot mount fusectl: {r.stderr.strip()}")
        mounted_here = True
    try:
        yield CONNECTIONS
    finally:
        if mounted_here:
            subprocess.run(["umount", str(CONNECTIONS)], capture_output=True, check=False)


def connection(mountpoint: Path, connections: Path) -> Path:
    return connections / str(os.minor(os.stat(mountpoint).st_dev))


def test_a_mount_raises_the_kernels_background_limit_and_congestion_threshold(
    fusectl: Path, ckpt: Mount
) -> None:
    conn = connection(ckpt.mountpoint, fusectl)
    assert int((conn / "max_background").read_text()) == MAX_BACKGROUND  # libfuse left 12
    assert int((conn / "congestion_threshold").read_text()) == CONGESTION_THRESHOLD  # was 9
    assert CONGESTION_THRESHOLD < MAX_BACKGROUND


def test_limits_set_higher_are_kept_and_without_fusectl_nothing_is_written(
    ckpt: Mount, tmp_path: Path
) -> None:
    fake = tmp_path / "connections"
    conn = connection(ckpt.mountpoint, fake)
    conn.mkdir(parents=True)
    (conn / "max_background").write_text("200\n")
    (conn / "congestion_threshold").write_text("9\n")
    assert tune_connection(ckpt.mountpoint, fake)
    assert (conn / "max_background").read_text() == "200\n"  # an admin's higher value stays
    assert int((conn / "congestion_threshold").read_text()) == CONGESTION_THRESHOLD

    empty = tmp_path / "none"
    empty.mkdir()
    assert not tune_connection(ckpt.mountpoint, empty)
    assert list(empty.iterdir()) == []
