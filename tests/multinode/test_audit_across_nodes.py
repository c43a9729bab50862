"""The audit log of a shared catalog (docs/governance.md "Audit log"): two nodes on one real
PostgreSQL catalog creating files at once append to one chain (every seq once, each
record naming its node), ``ckptfs audit verify`` on either node says it is intact, and an
edit of the shared table by hand is found; a killed node's records are chained by a live one."""

from __future__ import annotations

import json
import threading

import psycopg
import pytest

from tests.multinode.conftest import Cluster
from tests.support.mountutil import Mount, run_cli

pytestmark = pytest.mark.usefixtures("postgres")


def writer(m: Mount, tag: str, n: int, errors: list[BaseException]) -> None:
    try:
        d = m.mountpoint / "shared"
        for i in range(n):
            (d / f"{tag}-{i}").write_bytes(tag.encode() * 10)
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)


def records(m: Mount) -> list[dict[str, object]]:
    res = run_cli("audit", "export", str(m.mountpoint), "--json")
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in res.stdout.splitlines()]


def test_two_nodes_writing_at_once_make_one_valid_chain(cluster: Cluster, pg_url: str) -> None:
    a, b = cluster.node("a"), cluster.node("b")
    (a.mountpoint / "shared").mkdir()
    errors: list[BaseException] = []
    threads = [threading.Thread(target=writer, args=(m, tag, 30, errors))
               for m, tag in ((a, "a"), (b, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    recs = records(b)
    assert [r["seq"] for r in recs] == list(range(1, len(recs) + 1))
    made = {(r["node"], r["path"]) for r in recs if r["action"] == "create"}
    assert {("a", f"/shared/a-{i}") for i in range(30)} <= made
    assert {("b", f"/shared/b-{i}") for i in range(30)} <= made
    for m in (a, b):
        res = run_cli("audit", "verify", str(m.mountpoint))
        assert res.returncode == 0 and "intact" in res.stdout, res.stdout + res.stderr
    victim = next(r["seq"] for r in recs if r["path"] == "/shared/b-7")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE audit_log SET node = 'a' WHERE seq = %s", (victim,))
    res = run_cli("audit", "verify", str(a.mountpoint))
    assert res.returncode == 1 and f"record {victim} was edited" in res.stdout, res.stdout



def test_a_killed_nodes_records_are_chained_by_a_live_one(cluster: Cluster, pg_url: str) -> None:
    """A node's records are pending rows of its changes' transactions until a flush or a
    read chains them (catalog/audit.py): a node killed (-9) right after its closes loses
    none; the live node's export chains whatever it left, after what was chained before,
    and verify says intact."""
    a, b = cluster.node("a"), cluster.node("b")
    (b.mountpoint / "first").write_bytes(b"1")
    assert [r["path"] for r in records(b) if r["action"] == "create"] == ["/first"]
    for i in range(8):
        (a.mountpoint / f"a-{i}").write_bytes(b"a" * 10)
    a.kill9()
    recs = records(b)
    assert [r["seq"] for r in recs] == list(range(1, len(recs) + 1))
    assert {("a", f"/a-{i}") for i in range(8)} <= {
        (r["node"], r["path"]) for r in recs if r["action"] == "create"}
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM audit_pending").fetchone()
    assert row is not None and row[0] == 0
    res = run_cli("audit", "verify", str(b.mountpoint))
    assert res.returncode == 0 and "intact" in res.stdout, res.stdout + res.stderr
