"""chunks/residency.py: where a chunk's copies may be (the intersection over the namespaces
naming it), the snapshot targets, copies out of residency, refusals counted and logged once;
and the load-time check of a remote durability policy no catalog snapshot may serve."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ckptfs.chunks.residency import Residency
from ckptfs.config import load_config
from ckptfs.config.model import GovernanceConfig, NamespaceConfig
from ckptfs.errors import ConfigError
from ckptfs.stats import Stats

EU = NamespaceConfig(path="/eu", uids=(1,), allowed_locations=("eu",), origin="namespace[0]")
EUUS = NamespaceConfig(path="/both", uids=(1,), allowed_locations=("eu", "us"),
                       origin="namespace[1]")
FREE = NamespaceConfig(path="/free", uids=(1,), origin="namespace[2]")
LOCS = {"eu0": "eu", "us0": "us", "s3eu": "eu", "s3us": "us"}
A, B, C = b"a" * 32, b"b" * 32, b"c" * 32


def make(*ns: NamespaceConfig, stats: Stats | None = None) -> Residency:
    return Residency(GovernanceConfig(namespaces=ns), LOCS, stats)


def test_nothing_is_bound_without_allowed_locations() -> None:
    r = make(FREE)
    assert not r.enabled
    assert r.for_path("/free/x") is None
    r.note([A], frozenset({"eu"}))
    assert r.allowed(A) is None and r.permits(A, "us0")
    assert r.tiers_for(A, ["us0", "eu0"]) == ["us0", "eu0"]
    assert r.status() is None


def test_a_shared_chunk_may_be_only_where_every_namespace_allows() -> None:
    r = make(EU, EUUS, FREE)
    assert r.for_path("/eu/run/x") == frozenset({"eu"})
    assert r.for_path("/free/x") is None and r.for_path("/elsewhere") is None
    r.note([A], r.for_path("/both/f"))
    assert r.tiers_for(A, ["eu0", "us0"]) == ["eu0", "us0"]
    r.note([A], r.for_path("/eu/f"))  # the same bytes in /eu too: the intersection
    assert r.tiers_for(A, ["eu0", "us0", "s3us", "s3eu"]) == ["eu0", "s3eu"]
    r.note([A], r.for_path("/free/f"))  # an unbound namespace widens nothing
    assert r.allowed(A) == frozenset({"eu"})
    # A writer's own bound narrows a chunk not noted yet.
    assert r.allowed(B) is None and r.allowed(B, frozenset({"us"})) == frozenset({"us"})
    assert not r.permits(B, "eu0", frozenset({"us"}))
    # An unlinked file (no path): only where every bound namespace allows.
    assert r.for_path("<unlinked>/tmp") == frozenset({"eu"})


def test_snapshots_go_where_every_bound_namespace_allows() -> None:
    assert make(EU, EUUS).snapshot_targets(["s3eu", "s3us"]) == ["s3eu"]
    assert make(EU, NamespaceConfig(path="/us", uids=(1,), allowed_locations=("us",))
                ).snapshot_targets(["s3eu", "s3us"]) == []


def test_copies_out_of_residency_are_counted_per_tier() -> None:
    r = make(EU)
    r.load({"/eu": [A, B]})
    assert r.out_of_residency({"eu0": [A, B, C], "us0": [A, C], "s3us": [A, B]}) == {
        "us0": 1, "s3us": 2}


@pytest.mark.allow_log_warnings("residency:")
def test_refusals_are_counted_each_and_logged_once_per_kind_and_tier(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stats = Stats()
    r = make(EU, stats=stats)
    r.load({"/eu": [A, B]})
    with caplog.at_level(logging.WARNING, logger="ckptfs.residency"):
        for d in (A, B, A):
            r.refuse("upload", "s3us", d)
        r.refuse("upload", "us0", A)
        r.refuse("read", "s3us", A)
    assert stats.get("residency_refused_upload") == 4
    assert stats.get("residency_refused_read") == 1
    lines = [rec.getMessage() for rec in caplog.records]
    assert len(lines) == 3, lines
    assert "tier s3us (location us)" in lines[0] and "['eu']" in lines[0]


CONFIG = """
[[tier]]
name = "eu0"
kind = "local"
path = "/nvme0/ckptfs"
location = "eu"
[[tier]]
name = "us0"
kind = "local"
path = "/nvme1/ckptfs"
location = "us"
[[tier]]
name = "s3eu"
kind = "s3"
bucket = "b-eu"
location = "eu"
[[tier]]
name = "s3us"
kind = "s3"
bucket = "b-us"
location = "us"
[[namespace]]
path = "/proj-eu"
uids = [1]
allowed_locations = ["eu"]
[[namespace]]
path = "/proj-us"
uids = [2]
allowed_locations = ["us"]
"""


def test_a_remote_durability_policy_needs_a_remote_every_bound_namespace_allows(
    tmp_path: Path,
) -> None:
    p = tmp_path / "ckptfs.toml"
    p.write_text(f'state_dir = "{tmp_path}/state"\n' + CONFIG)
    load_config(p)  # no remote policy: each namespace has its tiers; no snapshot is made
    p.write_text(p.read_text() + '[[policy]]\npath = "/final"\ndurability = "remote"\n')
    with pytest.raises(ConfigError) as err:
        load_config(p)
    msg = str(err.value)
    assert msg.startswith("namespace[0].allowed_locations, namespace[1].allowed_locations: ")
    assert "catalog snapshot" in msg and "'/final'" in msg
    p.write_text(p.read_text().replace('allowed_locations = ["us"]',
                                       'allowed_locations = ["us", "eu"]'))
    assert load_config(p).governance.namespaces[1].allowed_locations == ("us", "eu")
