"""The direct data path on a real mount (docs/direct-path.md): bytes written through the
daemon's socket and memfd read bit-identical through FUSE and the other way round; a
caller outside a namespace refused through the socket as through FUSE (its identity from
SO_PEERCRED); a client killed mid-write commits nothing; no socket: the client says so
and gives None."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.test_faults import all_chunk_files
from tests.mount.test_namespaces import OWNER, STRANGER, made, ns_mounted
from tests.mount.test_posix_perms import CHILD_PYTHON, as_user, needs_root
from tests.support.mountutil import Mount, run_cli, wait_until

from ckptfs.client import DirectClient, connect, discover, find_socket

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.allow_log_warnings("access refused")


@pytest.fixture
def direct_mount(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Mount]:
    """A mount with the namespaces of test_namespaces.py and its direct socket in a
    runtime dir of this test (the daemon and the clients inherit the variable)."""
    base = Path(os.environ.get("TMPDIR", "/tmp")) / f"ckptfs-run-{os.getpid()}-{tmp_path.name}"
    base.mkdir(mode=0o755)
    base.chmod(0o755)
    run = base / "run"  # made by the daemon: other users' clients must reach it
    monkeypatch.setenv("CKPTFS_RUNTIME_DIR", str(run))
    try:
        with ns_mounted() as m:
            wait_until(lambda: find_socket(m.mountpoint), what="the direct socket")
            yield m
    finally:
        shutil.rmtree(base, ignore_errors=True)


def client_of(m: Mount) -> DirectClient:
    c = connect(m.mountpoint, memory=1 << 20)  # smaller than the files: several WRITEs
    assert c is not None
    return c


def test_socket_to_fuse_and_back_bit_identical(direct_mount: Mount) -> None:
    mp = direct_mount.mountpoint
    data = os.urandom(5 * (256 << 10) + 12345)  # several 256 KiB chunks and a tail
    with client_of(direct_mount) as c:
        c.write_file(mp / "a.bin", data)
        assert (mp / "a.bin").read_bytes() == data
        other = os.urandom(3 << 20)
        (mp / "b.bin").write_bytes(other)
        assert c.read_file(mp / "b.bin") == other
        # A direct write over a file FUSE has cached: the commit drops the cached pages.
        again = os.urandom(len(data))
        c.write_file(mp / "a.bin", again)
        assert (mp / "a.bin").read_bytes() == again
        assert c.stat(mp / "a.bin")[0] == len(again)


CHILD = """
import json, os, sys
from ckptfs.client import connect
mp = sys.argv[1]
c = connect(mp, memory=1 << 20)
assert c is not None, "no direct connection for this user"
out = []
for stmt in json.loads(sys.argv[2]):
    try:
        exec(stmt)
        out.append(0)
    except OSError as e:
        out.append(e.errno)
print(json.dumps(out), flush=True)
"""


def client_as(m: Mount, uid: int, calls: list[str]) -> list[int]:
    """Each statement run by a client process of ``uid`` (``c``: its DirectClient)."""
    res = subprocess.run(
        [CHILD_PYTHON, "-c", CHILD, str(m.mountpoint), json.dumps(calls)], user=uid,
        group=uid, cwd="/", env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=60, check=True)
    return list(json.loads(res.stdout))


@needs_root
def test_another_namespaces_user_is_refused_through_the_socket(direct_mount: Mount) -> None:
    mp = direct_mount.mountpoint
    made(mp)  # /proj-a: OWNER's namespace, mode 0777; proj-a/f mode 0666
    calls = [
        f"assert c.read_file({str(mp / 'proj-a/f')!r}) == b'secret'",
        f"c.write_file({str(mp / 'proj-a/new')!r}, b'x' * 1000)",
        f"c.stat({str(mp / 'proj-a/f')!r})",
    ]
    assert client_as(direct_mount, STRANGER, calls) == [errno.EACCES] * 3
    # Root without an admin group may not look inside either: the owner checks, with
    # FUSE calls (the file the stranger tried is absent) and with its own client.
    new = str(mp / "proj-a/new")
    assert as_user(mp, OWNER, OWNER, [f"os.stat({new!r})"]) == [errno.ENOENT]
    assert client_as(direct_mount, OWNER, calls) == [0, 0, 0]
    assert as_user(mp, OWNER, OWNER, [
        f"assert open({new!r}, 'rb').read() == b'x' * 1000",
        f"assert os.stat({new!r}).st_uid == {OWNER}",  # created as the caller
    ]) == [0, 0]


KILLED = """
import os, sys, time
from ckptfs.client import connect
mp = sys.argv[1]
c = connect(mp, memory=1 << 20)
h, _size = c.open(os.path.join(mp, "old.bin"), os.O_WRONLY)
c.pwrite(h, b"N" * (1 << 20), 0)
n = c.create(os.path.join(mp, "new.bin"))
c.pwrite(n, b"M" * (1 << 20), 0)
print("written", flush=True)
time.sleep(600)
"""


def test_a_client_killed_mid_write_commits_nothing(direct_mount: Mount) -> None:
    mp = direct_mount.mountpoint
    old = os.urandom(1 << 20)
    (mp / "old.bin").write_bytes(old)
    child = subprocess.Popen([CHILD_PYTHON, "-c", KILLED, str(mp)], stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "written"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    wait_until(lambda: f"direct connection of pid {child.pid} ended: 2 handle(s) released "
               "uncommitted" in direct_mount.log, what="the daemon released the handles")
    assert (mp / "old.bin").read_bytes() == old
    assert (mp / "new.bin").stat().st_size == 0  # created (as a FUSE create is), no data
    # Not committed later either: the unmount's drain of open files finds nothing. The
    # whole chunks the daemon had stored for it were collected: no frame is left behind.
    direct_mount.stop()
    res = run_cli("fsck", "--state-dir", str(direct_mount.state_dir), "--verify", timeout=180)
    assert res.returncode == 0 and "fsck: clean" in res.stdout, res.stdout + res.stderr
    direct_mount.start()
    assert (mp / "old.bin").read_bytes() == old
    assert (mp / "new.bin").stat().st_size == 0


@pytest.mark.allow_log_warnings("direct path unavailable")
def test_no_socket_means_no_client_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("CKPTFS_RUNTIME_DIR", str(tmp_path / "none"))
    monkeypatch.setenv("CKPTFS_DIRECT_SOCKET", str(tmp_path / "none.sock"))
    monkeypatch.setattr(discover, "_said", set())
    assert find_socket(tmp_path) is None
    assert connect(tmp_path) is None
    assert connect(tmp_path / "x") is None
    said = [r for r in caplog.records if "direct path unavailable" in r.getMessage()]
    assert len(said) == 1


@pytest.mark.allow_log_warnings("direct path unavailable")
def test_a_socket_in_a_directory_others_may_write_is_not_trusted(
    direct_mount: Mount, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anyone may make a socket named for the mount's device and answer HELLO with it: a
    client takes only a socket in a directory of root's or its own user, that no one else
    may write."""
    found = find_socket(direct_mount.mountpoint)
    assert found is not None and found[3] == 0  # the test's runtime dir: root's, 0755
    run = found[0].parent
    run.chmod(0o777)
    try:
        monkeypatch.setattr(discover, "_said", set())
        assert find_socket(direct_mount.mountpoint) is None
        assert connect(direct_mount.mountpoint) is None
    finally:
        run.chmod(0o755)


@pytest.mark.allow_log_errors
def test_a_corrupt_chunk_is_eio_through_the_socket(direct_mount: Mount) -> None:
    """Bytes reach a direct reader only verified: a flipped bit in a stored chunk is the
    READ's EIO (its pieces are read concurrently: one errno, not a crash), as through FUSE;
    an intact file on the same mount still reads."""
    mp = direct_mount.mountpoint
    bad, good = os.urandom(1 << 20), os.urandom(1 << 20)
    before = all_chunk_files(direct_mount.locals)
    with client_of(direct_mount) as c:
        c.write_file(mp / "bad.bin", bad)
        chunks = all_chunk_files(direct_mount.locals) - before
        c.write_file(mp / "good.bin", good)
    assert chunks
    direct_mount.stop()
    for victim in chunks:
        raw = bytearray(victim.read_bytes())
        raw[len(raw) // 2] ^= 0x40
        victim.write_bytes(bytes(raw))
    direct_mount.start()
    wait_until(lambda: find_socket(mp), what="the direct socket")
    with client_of(direct_mount) as c:
        with pytest.raises(OSError) as err:
            c.read_file(mp / "bad.bin")
        assert err.value.errno == errno.EIO
        assert c.read_file(mp / "good.bin") == good  # the connection goes on
    with pytest.raises(OSError) as err:
        (mp / "bad.bin").read_bytes()
    assert err.value.errno == errno.EIO


@needs_root
def test_a_write_only_handle_reads_nothing(direct_mount: Mount) -> None:
    """A file others may write but not read (0622): a stranger's direct handle opened for
    writing is checked for writing only, so its READ is EBADF (as read(2) of a write-only
    descriptor), not the file's bytes; a read-only handle's WRITE likewise."""
    mp = direct_mount.mountpoint
    drop = mp / "drop.bin"
    drop.write_bytes(b"secret" * 1000)
    drop.chmod(0o622)
    calls = [
        f"h, _s = c.open({str(drop)!r}, os.O_WRONLY)",
        "buf = bytearray(6000); n = c.preadinto(h, buf, 0)",
        "assert buf == bytearray(6000)",
        f"c.open({str(drop)!r}, os.O_RDONLY)",
    ]
    assert client_as(direct_mount, STRANGER, calls) == [0, errno.EBADF, 0, errno.EACCES]
    (mp / "pub.bin").write_bytes(b"p" * 100)
    with client_of(direct_mount) as c:
        h, _size = c.open(mp / "pub.bin", os.O_RDONLY)
        with pytest.raises(OSError) as err:
            c.pwrite(h, b"q" * 100, 0)
        assert err.value.errno == errno.EBADF
        c.close(h)
        # O_TRUNC without write access: refused, not a size of 0 for an untouched file
        with pytest.raises(OSError) as err:
            c.open(mp / "pub.bin", os.O_RDONLY | os.O_TRUNC)
        assert err.value.errno == errno.EINVAL
    assert (mp / "pub.bin").read_bytes() == b"p" * 100
    assert drop.read_bytes() == b"secret" * 1000
