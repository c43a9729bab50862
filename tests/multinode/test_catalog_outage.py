"""The shared catalog's database stops under a live node and comes back: files already
open keep reading, namespace changes fail with EIO (and a log line) instead of hanging,
and everything works again once PostgreSQL is back. Real mount, real PostgreSQL."""

from __future__ import annotations

import errno
import os

import pytest

from tests.conftest import TEST_MOUNT_ARGS, CkptFactory
from tests.support.mountutil import wait_until
from tests.support.pgserver import PgServer


@pytest.mark.slow
@pytest.mark.allow_log_errors("PostgreSQL", "catalog")
@pytest.mark.allow_log_warnings()
def test_a_database_outage_fails_changes_with_eio_and_keeps_open_files_readable(
    ckpt_factory: CkptFactory, postgres: PgServer, pg_url: str
) -> None:
    a = ckpt_factory.mount(extra_args=[*TEST_MOUNT_ARGS, "--catalog", pg_url, "--node", "a"],
                           name="a")
    data = os.urandom(3 * 256 * 1024)
    (a.mountpoint / "weights.bin").write_bytes(data)
    with open(a.mountpoint / "weights.bin", "rb") as f:
        head = f.read(1000)  # opened (and its extents read) before the outage
        postgres.stop()
        try:
            assert head + f.read() == data  # an open file reads on: no catalog needed
            with pytest.raises(OSError) as info:
                (a.mountpoint / "new.txt").write_bytes(b"x")
            assert info.value.errno == errno.EIO
            with pytest.raises(OSError) as info:
                os.mkdir(a.mountpoint / "d")
            assert info.value.errno == errno.EIO
        finally:
            postgres.start()
    # Back: the pool reconnects by itself.
    wait_until(lambda: _creates(a.mountpoint / "after.txt"), 30, "a create after the outage")
    assert (a.mountpoint / "after.txt").read_bytes() == b"ok"
    assert (a.mountpoint / "weights.bin").read_bytes() == data
    assert "new.txt" not in os.listdir(a.mountpoint)
    assert "PostgreSQL" in a.log or "catalog" in a.log


def _creates(path: os.PathLike[str]) -> bool:
    try:
        with open(path, "wb") as f:
            f.write(b"ok")
        return True
    except OSError as exc:
        assert exc.errno == errno.EIO, exc
        return False
