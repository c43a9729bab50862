"""The direct path's resource limits on a real mount: no request of an unprivileged client
ends or starves the daemon. Descriptors passed over the socket are not hoarded (each one
passed costs the sender nothing once it closes its own), a connection's handles are
bounded, and a READ of a huge length past the end of a file costs what the file holds, not
a task per chunk of the length."""

from __future__ import annotations

import errno
import os
import resource
import socket
from pathlib import Path

import pytest

from tests.mount.test_direct import client_as, client_of, direct_mount  # noqa: F401
from tests.mount.test_namespaces import STRANGER
from tests.mount.test_posix_perms import needs_root
from tests.support.mountutil import Mount, pid_alive, wait_until

from ckptfs.client import connect, find_socket, wire
from ckptfs.direct.conn import MAX_HANDLES
from ckptfs.direct.server import MAX_CONNECTIONS_PER_UID


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _peak_rss(pid: int) -> int:
    """The daemon's peak resident memory (VmHWM), bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_descriptors_sent_over_the_socket_are_not_hoarded(
    direct_mount: Mount,  # noqa: F811
) -> None:
    """Thousands of descriptors sent without a MAP (four per message, the sender closing
    nothing: the same one sent again) leave the daemon's descriptor table as it was, give
    or take a few; the connection and the mount go on."""
    mp = direct_mount.mountpoint
    assert direct_mount.pid is not None
    with client_of(direct_mount) as c:
        before = _fds(direct_mount.pid)
        null = os.open("/dev/null", os.O_RDONLY)
        try:
            for rid in range(1000):
                # Each with a request of no known op (ENOSYS), so the connection goes on.
                socket.send_fds(c.sock, [wire.REQUEST.pack(0, 0, rid)], [null] * 4)
                length, status, _rid, err = wire.REPLY.unpack(c._recv_exact(wire.REPLY.size))
                c._recv_exact(length)
                assert (status, err) == (1, errno.ENOSYS)
        finally:
            os.close(null)
        after = _fds(direct_mount.pid)
        assert after - before <= 8, (before, after)
        (mp / "still.bin").write_bytes(b"x" * 1000)  # the daemon can still open files
        assert (mp / "still.bin").read_bytes() == b"x" * 1000


def test_a_connections_handles_are_bounded(direct_mount: Mount) -> None:  # noqa: F811
    mp = direct_mount.mountpoint
    (mp / "f.bin").write_bytes(b"y" * 100)
    with client_of(direct_mount) as c:
        for _ in range(MAX_HANDLES):
            c.open(mp / "f.bin")
        with pytest.raises(OSError) as err:
            c.open(mp / "f.bin")
        assert err.value.errno == errno.EMFILE
        with pytest.raises(OSError) as err:
            c.create(mp / "g.bin")
        assert err.value.errno == errno.EMFILE
    # The connection's end released them all: a new one opens and reads.
    with client_of(direct_mount) as c:
        assert c.read_file(mp / "f.bin") == b"y" * 100


def test_a_huge_read_past_the_end_costs_what_the_file_holds(
    direct_mount: Mount,  # noqa: F811
) -> None:
    """A READ of 16 GiB (a sparse memfd of that size costs the client nothing) of a small
    file: the file's bytes and a count that stops at its end; the daemon's memory does not
    grow with the length (a task per chunk of it was hundreds of MiB)."""
    mp = direct_mount.mountpoint
    data = os.urandom(300_000)
    (mp / "small.bin").write_bytes(data)
    assert direct_mount.pid is not None
    huge = 16 << 30
    with client_of(direct_mount) as c:
        os.ftruncate(c.memfd, huge)
        c._call(wire.MAP, wire.U64.pack(huge), fds=[c.memfd])  # the daemon sees its size
        h, size = c.open(mp / "small.bin")
        assert size == len(data)
        peak = _peak_rss(direct_mount.pid)
        for off in (0, 1 << 30):  # from the start, and from far past the end
            got = wire.U64.unpack(c._call(wire.READ, wire.IO_REQ.pack(h, off, 0, huge)))[0]
            assert got == (len(data) if off == 0 else 0)
        assert os.pread(c.memfd, len(data), 0) == data
        grown = _peak_rss(direct_mount.pid) - peak
        assert grown < 64 << 20, f"the daemon's peak memory grew {grown >> 20} MiB"
        c.close(h)


def test_only_memory_is_mapped(direct_mount: Mount, tmp_path: Path) -> None:  # noqa: F811
    """MAP takes a memfd, not a file of some filesystem (whose copies could block for ever
    in the store's I/O threads: a stopped FUSE mount of the client's own): EINVAL, and
    the memfd mapped before stays."""
    mp = direct_mount.mountpoint
    data = os.urandom(5000)
    (mp / "m.bin").write_bytes(data)
    disk = tmp_path / "plain"
    disk.write_bytes(b"\0" * (1 << 20))
    fd = os.open(disk, os.O_RDWR)
    try:
        with client_of(direct_mount) as c:
            with pytest.raises(OSError) as err:
                c._call(wire.MAP, wire.U64.pack(1 << 20), fds=[fd])
            assert err.value.errno == errno.EINVAL
            assert c.read_file(mp / "m.bin") == data  # through the memfd it had
    finally:
        os.close(fd)
    assert disk.read_bytes() == b"\0" * (1 << 20)


@needs_root
@pytest.mark.allow_log_warnings("refused: uid")
def test_one_users_connections_are_bounded(direct_mount: Mount) -> None:  # noqa: F811
    """Each connection costs the daemon descriptors: a user past MAX_CONNECTIONS_PER_UID
    gets no client (the fallback to the mount), and one again once it closed some."""
    mp = direct_mount.mountpoint
    calls = [
        # The child holds one (``c``): all but one more.
        f"cs = [connect(mp, memory=4096) for _ in range({MAX_CONNECTIONS_PER_UID - 1})]",
        "assert all(cs)",
        "assert connect(mp, memory=4096) is None",
        "cs.pop().close_connection()",
        # The daemon ends that connection as soon as it sees it closed: wait for that.
        "again = next(filter(None, (connect(mp, 4096) or time.sleep(0.05) "
        "for _ in range(200))), None)",
        "assert again is not None and again.stat(os.path.join(mp, 'x.bin'))[0] == 3",
    ]
    (mp / "x.bin").write_bytes(b"abc")
    out = client_as(direct_mount, STRANGER, ["import time", *calls])
    assert out == [0] * (len(calls) + 1)
    assert "refused: uid 4242 holds" in direct_mount.log


@pytest.mark.allow_log_warnings("accept failed")
def test_the_server_outlives_running_out_of_descriptors(
    direct_mount: Mount,  # noqa: F811
) -> None:
    """An accept that fails for want of descriptors (EMFILE: one user's connections can
    exhaust them) leaves the daemon and its server serving: once descriptors are free
    again, new clients connect. It ended the daemon: the OSError reached the mount's
    nursery inside an exception group, past _serve_direct's ``except OSError``."""
    mp = direct_mount.mountpoint
    pid = direct_mount.pid
    assert pid is not None
    found = find_socket(mp)
    assert found is not None
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (_fds(pid), hard))
        raw.connect(str(found[0]))  # queued: the daemon's accept fails with EMFILE
        wait_until(lambda: "accept failed" in direct_mount.log or not pid_alive(pid),
                   what="the daemon's accept to fail")
    finally:
        if pid_alive(pid):
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
        raw.close()
    assert pid_alive(pid), "the daemon ended: " + direct_mount.log[-2000:]
    (mp / "y.bin").write_bytes(b"yy")
    c = connect(mp, memory=4096)
    assert c is not None, direct_mount.log[-2000:]
    with c:
        assert c.read_file(mp / "y.bin") == b"yy"
