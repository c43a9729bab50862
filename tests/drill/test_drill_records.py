"""The drills' records (catalog/drills.py) on both engines, the schema-10 migration of an
older catalog on both, and the pure parts of a drill: the [drill] config (a bad key exits
2 naming it), whose access rules a drill reads with, the mode bits."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tests.support.catalogs import Cat, downgrade_postgres, downgrade_sqlite
from tests.support.mountutil import run_cli

from ckptfs.catalog import Inode, PostgresCatalog, SqliteCatalog
from ckptfs.catalog.audit import AuditRecord
from ckptfs.catalog.catalog import SCHEMA_VERSION
from ckptfs.catalog.drills import DrillRow
from ckptfs.config import config_from_dict
from ckptfs.config.model import NamespaceConfig
from ckptfs.drill.principal import Principal, choose_principal, parse_asked
from ckptfs.drill.service import ancestors, mode_allows
from ckptfs.errors import ConfigError, InvalidArgument, NotPermitted


def row(run: str, result: str, started: int, problem: str = "") -> DrillRow:
    return DrillRow(run, f"{run}/ckpt-{started}", "n1", 1000, 1000, started, 2_000_000_000,
                    100 << 20, 400 << 20, result, problem)


def test_drills_are_recorded_with_their_audit_record_and_read_newest_first(cat: Cat) -> None:
    a1 = cat.record_drill(row("/a", "passed", 1), audit=AuditRecord("drill", uid=0))
    a2 = cat.record_drill(row("/a", "failed", 2, "object x corrupt"))
    b1 = cat.record_drill(row("/b", "passed", 3))
    assert a1 < a2 < b1
    assert [r.id for r in cat.drill_rows()] == [b1, a2, a1]
    assert [r.id for r in cat.drill_rows("/a", limit=1)] == [a2]
    assert [(r.run, r.result) for r in cat.last_drills()] == [("/a", "failed"), ("/b", "passed")]
    assert [r.id for r in cat.last_drills("passed")] == [a1, b1]
    [last] = [r for r in cat.last_drills() if r.run == "/a"]
    assert last.problem == "object x corrupt" and not last.passed
    assert last.mb_per_s == pytest.approx((100 << 20) / 2 / 1e6)
    assert last.implied_s == pytest.approx(8.0)  # four times the bytes at the same rate
    [entry] = [e for e in cat.audit_entries() if e.action == "drill"]
    assert entry.path == "/a/ckpt-1"


def _drills_work(c: Cat) -> None:
    assert c.get_meta("schema_version") == str(SCHEMA_VERSION) == "11"
    c.record_drill(row("/r", "passed", 5))
    assert [r.run for r in c.last_drills()] == ["/r"]


def test_a_version_9_sqlite_catalog_gets_the_drills_table(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    downgrade_sqlite(path, 9, "DROP TABLE drills")
    c = SqliteCatalog(path)
    try:
        _drills_work(c)
    finally:
        c.close()


def test_a_version_9_postgres_catalog_gets_the_drills_table(pg_url: str) -> None:
    downgrade_postgres(pg_url, 9, "DROP TABLE drills")
    c = PostgresCatalog(pg_url, pool_size=1)
    try:
        _drills_work(c)
    finally:
        c.close()


# ------------------------------------------------------------------------------ config


def test_the_drill_section_is_read_and_checked() -> None:
    d = config_from_dict({"drill": {"interval": 86400, "runs": ["/proj-a/run/", "/b"],
                                    "bandwidth": "200MiB", "scratch": "/var/tmp/drill"}}).drill
    assert (d.interval_s, d.runs, d.bandwidth, str(d.scratch)) == (
        86400.0, ("/proj-a/run", "/b"), 200 << 20, "/var/tmp/drill")
    assert config_from_dict({}).drill.runs == ()
    for bad, key in (({"intervall": 1}, "drill.intervall"), ({"interval": 5}, "drill.interval"),
                     ({"runs": "/a"}, "drill.runs"), ({"runs": ["a"]}, "drill.runs[0]"),
                     ({"runs": ["/a", "/a/"]}, "drill.runs"), ({"bandwidth": 10}, "drill.bandwidth"),
                     ({"scratch": "tmp"}, "drill.scratch")):
        with pytest.raises(ConfigError, match=key.replace("[", r"\[")):
            config_from_dict({"drill": bad})


def test_a_bad_drill_key_exits_2_naming_it(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[drill]\nruns = ["/run"]\nbandwith = "1GiB"\n')
    res = run_cli("drill", "--config", str(cfg), "--state-dir", str(tmp_path / "state"))
    assert res.returncode == 2 and "drill.bandwith: unknown key" in res.stderr, res.stderr
    cfg.write_text("[drill]\n")
    res = run_cli("drill", "--config", str(cfg), "--state-dir", str(tmp_path / "state"))
    assert res.returncode == 2 and "[drill] runs" in res.stderr, res.stderr


# ------------------------------------------------------------------------------ principal


NS = NamespaceConfig("/proj-a", uids=(4201, 4203), gids=(4302,))


def test_root_drills_as_the_namespace_principal_a_user_as_themselves() -> None:
    owner, root, user = Principal(7, 8), Principal(0, 0), Principal(4201, 100)
    assert choose_principal(NS, owner, root, None) == Principal(4201, 4302)
    assert choose_principal(NamespaceConfig("/x"), owner, root, None) == owner
    assert choose_principal(NS, owner, root, Principal(5, 5)) == Principal(5, 5)
    assert choose_principal(NS, owner, user, None) == user
    with pytest.raises(NotPermitted):
        choose_principal(NS, owner, user, root)


def test_the_drill_xattr_value() -> None:
    assert parse_asked(b"") == parse_asked(b"{}")
    asked = parse_asked(b'{"run": "/a/b", "as": [1, 2]}')
    assert (asked.run, asked.principal) == ("/a/b", Principal(1, 2))
    for bad in (b"nope", b'{"as": [1]}', b'{"as": [-1, 0]}', b'{"run": "a"}', b'{"x": 1}'):
        with pytest.raises(InvalidArgument):
            parse_asked(bad)


def test_mode_bits_as_the_kernel_checks_them() -> None:
    f = Inode(5, stat.S_IFREG | 0o640, 10, 20, 0, 1, 0, 0, 0)
    assert mode_allows(f, Principal(10, 99), 4) and mode_allows(f, Principal(11, 20), 4)
    assert not mode_allows(f, Principal(11, 21), 4)
    assert not mode_allows(f, Principal(11, 20), 1)
    assert mode_allows(f, Principal(0, 0), 4)
    assert ancestors("/a/b/c") == ["/", "/a", "/a/b"]
