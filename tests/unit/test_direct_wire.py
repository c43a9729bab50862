"""The client's copy of the direct path's wire constants agrees with the server's (the
client imports nothing of the daemon, so the two are kept in step by this test)."""

from __future__ import annotations

import struct

from ckptfs.client import wire as client_wire
from ckptfs.direct import wire as server_wire


def test_client_and_server_speak_the_same_wire() -> None:
    names = [n for n in dir(server_wire) if n.isupper()]
    assert names == [n for n in dir(client_wire) if n.isupper()]
    for n in names:
        a, b = getattr(server_wire, n), getattr(client_wire, n)
        if isinstance(a, struct.Struct):
            assert (n, a.format) == (n, b.format)
        else:
            assert (n, a) == (n, b)
