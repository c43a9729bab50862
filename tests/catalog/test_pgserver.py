"""The PostgreSQL test server itself: unix socket only, data kept across a stop and start."""

from __future__ import annotations

import psycopg

from tests.support.pgserver import PgServer


def test_the_server_listens_on_its_socket_only_and_keeps_data_across_a_restart(
    postgres: PgServer, pg_url: str
) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert conn.execute("SHOW listen_addresses").fetchone() == ("",)
        conn.execute("CREATE TABLE kept (v TEXT)")
        conn.execute("INSERT INTO kept VALUES ('before')")
    postgres.stop()
    assert not postgres.ready()
    postgres.start()
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT v FROM kept").fetchall() == [("before",)]
