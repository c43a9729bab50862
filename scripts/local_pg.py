#!/usr/bin/env python3
"""Run a throwaway PostgreSQL (Debian's postgresql package) for the demo, until SIGTERM or
SIGINT; then stop it by PID and delete its data directory.

    local_pg.py ENV_FILE

The server is tests/support/pgserver.py's: initdb into a fresh temp dir (as the postgres
user when run as root), a unix socket in that dir, no TCP. Once it accepts connections and
an empty database exists, ENV_FILE gets one shell assignment: PG_URL (that database's
libpq URI).
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a script: the test helpers are the package tests.support

from tests.support.pgserver import PgServer, find_pg_bin  # noqa: E402


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    env_file = Path(sys.argv[1])
    if find_pg_bin() is None:
        print("local_pg: PostgreSQL server binaries not found (apt install postgresql)",
              file=sys.stderr)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = PgServer()
    try:
        server.start()
        url = server.new_database()
        tmp = env_file.with_name(env_file.name + ".tmp")
        tmp.write_text(f"PG_URL='{url}'\n")
        tmp.rename(env_file)  # appears whole: the demo waits for it
        stop.wait()
    finally:
        server.destroy()  # stops the postmaster by PID, removes the data directory
    return 0


if __name__ == "__main__":
    sys.exit(main())
