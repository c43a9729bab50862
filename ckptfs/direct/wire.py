"""The direct path's messages (docs/direct-path.md, "Wire protocol").

A request: ``u32 body length | u8 op | u32 id | body``; a reply: ``u32 body length |
u8 status | u32 id | u32 errno | body``. Little-endian. ckptfs/client/wire.py holds the
same constants (the client imports nothing of the daemon); tests/unit/test_direct_wire.py
checks that both agree.
"""

from __future__ import annotations

import struct

VERSION = 1
REQUEST = struct.Struct("<IBI")
REPLY = struct.Struct("<IBII")
MAX_BODY = 1 << 16  # paths and fixed fields only: bulk bytes travel in the memfd

HELLO, MAP, OPEN, CREATE, WRITE, READ, FSYNC, CLOSE, STAT = range(1, 10)

U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")
HELLO_REPLY = struct.Struct("<IQ")  # protocol version, st_dev of the mount
OPEN_REQ = struct.Struct("<I")  # flags, then the path
CREATE_REQ = struct.Struct("<II")  # flags, mode, then the path
OPEN_REPLY = struct.Struct("<QQ")  # handle, size
IO_REQ = struct.Struct("<QQQQ")  # handle, file offset, memfd offset, length
STAT_REPLY = struct.Struct("<QIIIQ")  # size, mode, uid, gid, mtime_ns
