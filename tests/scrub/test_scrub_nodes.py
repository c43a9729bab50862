"""Two nodes on one shared catalog (a real PostgreSQL) and one bucket (a real SeaweedFS):
each scrubs its own local tiers, and one at a time the remote, the holder of the lease in
the catalog; a clean unmount hands the lease on."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import CkptFactory
from tests.multinode.conftest import Cluster, Db, sync
from tests.remote.test_remote_mount import write
from tests.scrub.scrubkit import MiB, scrub_config, scrub_now
from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON

from ckptfs.catalog import PostgresCatalog

pytestmark = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)


@pytest.fixture
def cluster(ckpt_factory: CkptFactory, pg_url: str, remote: tuple[str, str]) -> Cluster:
    return Cluster(ckpt_factory, pg_url, remote[0])


@pytest.fixture
def db(pg_url: str) -> Db:
    cats: list[PostgresCatalog] = []

    def opened() -> PostgresCatalog:
        if not cats:
            cats.append(PostgresCatalog(pg_url, pool_size=1, readonly=True))
        return cats[0]

    return opened


def holder(db: Db) -> str | None:
    raw = db().get_meta("scrub_remote")
    return None if raw is None else str(json.loads(raw)["node"])


def test_only_the_lease_holder_scrubs_the_remote(
    tmp_path: Path, cluster: Cluster, db: Db
) -> None:
    # Passes on request only: what each scrubs is what its reports say.
    cfg = str(scrub_config(tmp_path / "c.toml", rate="1GiB", enabled=False))
    a = cluster.node("a", "--config", cfg)
    b = cluster.node("b", "--config", cfg)
    (a.mountpoint / "run").mkdir()
    write(a.mountpoint / "run" / "model.pt", os.urandom(MiB))
    sync(a, a.mountpoint / "run")
    reports = {}
    for m, name in ((a, "a"), (b, "b")):
        code, reports[name] = scrub_now(m)
        assert code == 0, reports[name]
    lease = holder(db)
    other = "b" if lease == "a" else "a"
    assert lease in ("a", "b"), lease
    assert reports[lease]["remote_here"] and "remote0" in reports[lease]["tiers"], reports
    assert not reports[other]["remote_here"] and reports[other]["remote"] == lease, reports
    assert "remote0" not in reports[other]["tiers"], reports
    # Each node its own local tiers, never the other's.
    assert [t for t in reports["a"]["tiers"] if t != "remote0"] == ["a:local0", "a:local1"]
    assert [t for t in reports["b"]["tiers"] if t != "remote0"] == ["b:local0", "b:local1"]
    assert reports["a"]["copies"] >= 4 + (4 if lease == "a" else 0)  # 4 chunks of 256 KiB
    # The holder unmounts: its lease ends with it, and the other node takes it.
    (a if lease == "a" else b).stop()
    assert holder(db) is None
    code, report = scrub_now(b if lease == "a" else a)
    assert code == 0 and report["remote_here"] and "remote0" in report["tiers"], report
    assert holder(db) == other
