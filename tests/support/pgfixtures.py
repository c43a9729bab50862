"""pytest fixtures for tests against a real PostgreSQL (pgserver.py).

tests/conftest.py imports these, so one server serves the whole session:

``postgres``  one PostgreSQL for the whole session (skipped if the server binaries are
              missing); a test that stops or pauses it must start or resume it again (in a
              ``finally``)
``pg_url``    the libpq URI of a fresh, empty database on that server (started again if
              it was down)
``nodes``     two catalogs on one such database, as two daemons on two nodes have them
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.pgserver import PgServer, find_pg_bin, running_postgres

from ckptfs.catalog import PostgresCatalog

SKIP_REASON = "PostgreSQL server binaries not found (apt install postgresql, or set CKPTFS_PG_BIN)"


@pytest.fixture(scope="session")
def postgres() -> Iterator[PgServer]:
    if find_pg_bin() is None:
        pytest.skip(SKIP_REASON)
    with running_postgres() as server:
        yield server


@pytest.fixture
def pg_url(postgres: PgServer) -> str:
    postgres.resume()
    postgres.start()
    return postgres.new_database()


@pytest.fixture
def nodes(pg_url: str) -> Iterator[tuple[PostgresCatalog, PostgresCatalog]]:
    """Two catalogs on one database, as two daemons on two nodes have them."""
    a = PostgresCatalog(pg_url)
    b = PostgresCatalog(pg_url)
    try:
        yield a, b
    finally:
        a.close()
        b.close()
