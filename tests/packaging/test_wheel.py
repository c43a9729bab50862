"""The package an operator installs (docs/operations.md, "Installing"): `python -m build`
makes a wheel and an sdist of this checkout; the wheel, installed into a fresh venv, mounts
with its own `ckptfs` entry point, and `ckptfs --version` names ckptfs, pyfuse3, libfuse and
the catalog schema.

No network here beyond loopback: the build runs with ``--no-isolation`` (an isolated build
would download setuptools into its own environment), and the fresh venv takes the
dependencies from the test venv's site-packages (a directory of links to every package
there but ckptfs itself, on the new venv's path through a .pth file); pip then installs
the wheel with ``--no-index``, checking that those satisfy every declared dependency."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pyfuse3
import pytest

from tests.support.mountutil import (
    DAEMON_LOGS,
    FUSE_AVAILABLE,
    SKIP_REASON,
    is_mounted,
    pid_alive,
    wait_until,
)

import ckptfs
from ckptfs.catalog.schema import SCHEMA_VERSION

pytestmark = pytest.mark.slow  # a build, a venv and an install: about 30 s on 2 cores

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "MANIFEST.in", "README.md", "ckptfs", "docs", "systemd", "scripts")
DATA = ("share/ckptfs/systemd/ckptfs.service", "share/ckptfs/systemd/ckptfs@.service",
        "share/ckptfs/mount.fuse.ckptfs")


def _clean_env() -> dict[str, str]:
    """The environment of the installed ckptfs: nothing points at this checkout."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the checkout's sources (the build writes its egg-info beside them), built."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        p = REPO / name
        if not p.exists():  # (MANIFEST.in before it was written: the sdist test says so)
            continue
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(p, src / name)
    out = tmp_path_factory.mktemp("dist")
    res = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out),
                          str(src)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return out


def _modules() -> set[str]:
    return {str(p.relative_to(REPO)) for p in (REPO / "ckptfs").rglob("*.py")}


def test_build_makes_a_wheel_and_an_sdist_with_everything_that_ships(dist: Path) -> None:
    (wheel,) = dist.glob("ckptfs-*.whl")
    (sdist,) = dist.glob("ckptfs-*.tar.gz")
    assert wheel.name == f"ckptfs-{ckptfs.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = z.read(f"ckptfs-{ckptfs.__version__}.dist-info/entry_points.txt").decode()
    assert _modules() <= names, sorted(_modules() - names)
    data = f"ckptfs-{ckptfs.__version__}.data/data/"
    assert {data + d for d in DATA} <= names
    assert "ckptfs = ckptfs.cli:main" in entry_points
    with tarfile.open(sdist) as t:
        members = {m.name.split("/", 1)[1] for m in t.getmembers() if "/" in m.name}
    want = _modules() | {"pyproject.toml", "README.md", "MANIFEST.in", "docs/operations.md",
                         "systemd/ckptfs.service", "scripts/mount.fuse.ckptfs"}
    assert want <= members, sorted(want - members)


@pytest.fixture(scope="module")
def venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed, its dependencies from this test's venv."""
    base = tmp_path_factory.mktemp("venv")
    deps = base / "deps"  # links to every installed package but ckptfs (editable here)
    deps.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        if "ckptfs" not in entry.name.lower():
            (deps / entry.name).symlink_to(entry)
    env_dir = base / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True,
                   timeout=120)
    py = env_dir / "bin" / "python"
    new_site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()"
                               "['purelib'])"], capture_output=True, text=True, check=True,
                              env=_clean_env()).stdout.strip()
    (Path(new_site) / "ckptfs-test-deps.pth").write_text(f"{deps}\n")
    (wheel,) = dist.glob("ckptfs-*.whl")
    res = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install",
                          "--no-index", "--no-cache-dir", str(wheel)], capture_output=True,
                         text=True, timeout=300, env=_clean_env())
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    where = subprocess.run([str(py), "-c", "import ckptfs; print(ckptfs.__file__)"],
                           capture_output=True, text=True, check=True, env=_clean_env(),
                           cwd=base).stdout.strip()
    assert where.startswith(new_site), where  # the wheel's copy, not this checkout
    for d in DATA:
        assert (env_dir / d).is_file(), d
    return env_dir


def test_version_names_ckptfs_pyfuse3_libfuse_and_the_catalog_schema(venv: Path) -> None:
    res = subprocess.run([str(venv / "bin" / "ckptfs"), "--version"], capture_output=True,
                         text=True, timeout=60, env=_clean_env(), cwd=venv)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == f"ckptfs {ckptfs.__version__}"
    assert f"pyfuse3 {pyfuse3.__version__}" in lines
    assert f"catalog schema {SCHEMA_VERSION}" in lines
    fuse = next(ln for ln in lines if ln.startswith("libfuse "))
    assert re.match(r"libfuse 3\.\d+\.\d+ \(/\S+libfuse3\.so[.\d]*\)$", fuse), fuse


@contextlib.contextmanager
def _cleanup(mountpoint: Path, state: Path) -> Iterator[None]:
    """Unmount and stop the daemon this test started (its pid file) if the test failed."""
    try:
        yield
    finally:
        if is_mounted(mountpoint):
            subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], capture_output=True)
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            pid = int((state / "daemon.pid").read_text())
            os.kill(pid, signal.SIGTERM)
        DAEMON_LOGS.snapshot(state)


@pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)
def test_the_installed_entry_point_mounts_writes_reads_and_unmounts(venv: Path,
                                                                     tmp_path: Path) -> None:
    exe = str(venv / "bin" / "ckptfs")
    mnt, state, tier = tmp_path / "mnt", tmp_path / "state", tmp_path / "tier0"
    mnt.mkdir()
    tier.mkdir()
    DAEMON_LOGS.register(state)
    with _cleanup(mnt, state):
        res = subprocess.run([exe, "mount", str(mnt), "--state-dir", str(state), "--local",
                              str(tier), "--metrics-address", "127.0.0.1:0"],
                             capture_output=True, text=True, timeout=120, env=_clean_env())
        assert res.returncode == 0, res.stderr
        pid = int((state / "daemon.pid").read_text())
        # The daemon is the venv's interpreter, which imports the installed package.
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert cmdline[0].decode().startswith(str(venv)), cmdline
        data = os.urandom(3 * 1024 * 1024 + 17)
        (mnt / "model.bin").write_bytes(data)
        assert (mnt / "model.bin").read_bytes() == data
        res = subprocess.run([exe, "umount", str(mnt)], capture_output=True, text=True,
                             timeout=120, env=_clean_env())
        assert res.returncode == 0, res.stderr
        assert not is_mounted(mnt)
        wait_until(lambda: not pid_alive(pid), what="the daemon exited")
    assert f"ckptfs {ckptfs.__version__} mounted at {mnt}" in (state / "ckptfs.log").read_text()
