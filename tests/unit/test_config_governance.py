"""The governance keys of a config: [[namespace]], [access], [keys], [audit], tier locations
and the whole-config checks (residency against the tiers, retention classes, key paths).
Every error names its key; the CLI exits 2 with it (tests/mount cover the exit code)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptfs.config import DEFAULT_NAMESPACE, config_from_dict, load_config
from ckptfs.errors import ConfigError


def cfg_file(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "ckptfs.toml"
    p.write_text(f'state_dir = "{tmp_path}/state"\n' + text)
    return p


FULL = """
[keys]
kek_file = "/etc/ckptfs/kek"
[access]
admin_gids = [10]
[audit]
signing_key_file = "/etc/ckptfs/audit.key"
seal_interval = 600
[[tier]]
name = "nvme0"
kind = "local"
path = "/nvme0/ckptfs"
location = "eu-west"
[[tier]]
name = "nvme1"
kind = "local"
path = "/nvme1/ckptfs"
location = "us-east"
[[retention]]
name = "short"
keep = 2
[[namespace]]
path = "/proj-a/"
uids = [1001, 1001]
gids = [2001]
allowed_locations = ["eu-west"]
encrypt = true
quota = "100GiB"
retention = "short"
[[namespace]]
path = "/proj-b"
gids = [2002]
"""


def test_full_governance_config(tmp_path: Path) -> None:
    cfg = load_config(cfg_file(tmp_path, FULL))
    gov = cfg.governance
    a, b = gov.namespaces
    assert a.path == "/proj-a" and a.uids == (1001,) and a.gids == (2001,)
    assert a.allowed_locations == ("eu-west",) and a.encrypt and a.quota == 100 * 2**30
    assert a.retention == "short" and a.origin == "namespace[0]"
    assert b.allowed_locations is None and not b.encrypt and b.quota is None
    assert gov.admin_gids == (10,) and gov.keys.kek_file == Path("/etc/ckptfs/kek")
    assert gov.audit.signing_key_file == Path("/etc/ckptfs/audit.key")
    assert gov.audit.seal_interval_s == 600
    assert [t.location for t in cfg.tiers] == ["eu-west", "us-east"]
    # The namespace's retention class covers its run directories, and only them.
    derived = [p for p in cfg.retention.policies if p.glob == "/proj-a/*"]
    assert len(derived) == 1 and derived[0].keep == 2
    assert derived[0].covers("/proj-a/run1") and not derived[0].covers("/proj-b/run1")
    assert not any(p.covers("/proj-b/run1") for p in cfg.retention.policies)


def test_namespace_lookup_and_ownership() -> None:
    gov = config_from_dict({"namespace": [{"path": "/p", "uids": [5], "gids": [7]}]}).governance
    ns = gov.namespace_for("/p/run/x.bin")
    assert ns.path == "/p" and gov.namespace_for("/p") is ns
    assert gov.namespace_for("/pq/x") is DEFAULT_NAMESPACE
    assert gov.namespace_for("/") is DEFAULT_NAMESPACE
    assert ns.owned_by(5, frozenset()) and ns.owned_by(9, frozenset({1, 7}))
    assert not ns.owned_by(0, frozenset({0})), "root is no owner unless named"
    assert not gov.is_admin(frozenset({0}))
    assert ns.allows_location("anywhere"), "no allowed_locations: no limit"


def test_no_governance_keys_means_no_namespaces() -> None:
    gov = config_from_dict({}).governance
    assert not gov.enabled and not gov.keys.configured and gov.audit.signing_key_file is None


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"namespace": [{"path": "/"}]}, "namespace[0].path"),
        ({"namespace": [{"path": "rel", "uids": [1]}]}, "namespace[0].path"),
        ({"namespace": [{"path": "/a/../b", "uids": [1]}]}, "namespace[0].path"),
        ({"namespace": [{"uids": [1]}]}, "namespace[0].path"),
        ({"namespace": [{"path": "/a"}]}, "namespace[0].uids"),
        ({"namespace": [{"path": "/a", "uids": [-1]}]}, "namespace[0].uids"),
        ({"namespace": [{"path": "/a", "uids": ["alice"]}]}, "namespace[0].uids"),
        ({"namespace": [{"path": "/a", "gids": [True]}]}, "namespace[0].gids"),
        ({"namespace": [{"path": "/a", "uids": [1], "allowed_locations": []}]},
         "namespace[0].allowed_locations"),
        ({"namespace": [{"path": "/a", "uids": [1], "allowed_locations": ["eu west"]}]},
         "namespace[0].allowed_locations"),
        ({"namespace": [{"path": "/a", "uids": [1], "quota": 0}]}, "namespace[0].quota"),
        ({"namespace": [{"path": "/a", "uids": [1], "quota": "lots"}]}, "namespace[0].quota"),
        ({"namespace": [{"path": "/a", "uids": [1], "encrypt": "yes"}]}, "namespace[0].encrypt"),
        ({"namespace": [{"path": "/a", "uids": [1], "encrypt": True}]}, "namespace[0].encrypt"),
        ({"namespace": [{"path": "/a", "uids": [1], "owners": 1}]}, "namespace[0].owners"),
        ({"namespace": [{"path": "/a", "uids": [1]}, {"path": "/a/b", "uids": [2]}]},
         "namespace[1].path"),
        ({"namespace": [{"path": "/a/b", "uids": [1]}, {"path": "/a", "uids": [2]}]},
         "namespace[1].path"),
        ({"namespace": [{"path": "/a", "uids": [1]}, {"path": "/a", "uids": [2]}]},
         "namespace[1].path"),
        ({"namespace": [{"path": "/a", "uids": [1], "retention": "nope"}]},
         "namespace[0].retention"),
        ({"namespace": {"path": "/a"}}, "namespace"),
        ({"keys": {"kek_file": "kek"}}, "keys.kek_file"),
        ({"keys": {"kek_file": "/k", "kek_command": "cat /k"}}, "keys.kek_command"),
        ({"keys": {"kek_command": " "}}, "keys.kek_command"),
        ({"keys": {"kek": "/k"}}, "keys.kek"),
        ({"keys": "/k"}, "keys"),
        ({"access": {"admin_gids": [0, "wheel"]}}, "access.admin_gids"),
        ({"access": {"admins": [0]}}, "access.admins"),
        ({"audit": {"signing_key_file": "rel"}}, "audit.signing_key_file"),
        ({"audit": {"seal_interval": 0}}, "audit.seal_interval"),
        ({"retention": [{"name": "a b", "keep": 1}]}, "retention[0].name"),
        ({"retention": [{"name": "a"}, {"name": "a"}]}, "retention[1].name"),
        ({"retention": [{"keep": 1}]}, "retention[0].path"),
    ],
)
def test_bad_governance_keys_are_named(data: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        config_from_dict(data)
    assert str(exc.value).startswith(key + ":"), str(exc.value)


def test_a_namespace_no_local_tier_may_hold_is_refused(tmp_path: Path) -> None:
    text = """
[[tier]]
name = "nvme0"
kind = "local"
path = "/nvme0"
location = "us-east"
[[namespace]]
path = "/p"
uids = [1]
allowed_locations = ["eu-west"]
"""
    with pytest.raises(ConfigError) as exc:
        load_config(cfg_file(tmp_path, text))
    msg = str(exc.value)
    assert msg.startswith("namespace[0].allowed_locations:"), msg
    assert "nvme0=us-east" in msg


def test_the_default_local_tier_has_location_local(tmp_path: Path) -> None:
    text = '[[namespace]]\npath = "/p"\nuids = [1]\nallowed_locations = ["local"]\n'
    cfg = load_config(cfg_file(tmp_path, text))
    assert [t.location for t in cfg.tiers] == ["local"]


def test_remote_durability_needs_an_allowed_remote(tmp_path: Path) -> None:
    text = """
[[tier]]
name = "nvme0"
kind = "local"
path = "/nvme0"
location = "eu-west"
[[tier]]
name = "bucket"
kind = "s3"
bucket = "ckpt"
location = "us-east"
[[policy]]
path = "/p/important"
durability = "remote"
[[namespace]]
path = "/p"
uids = [1]
allowed_locations = ["eu-west"]
"""
    with pytest.raises(ConfigError) as exc:
        load_config(cfg_file(tmp_path, text))
    assert str(exc.value).startswith("namespace[0].allowed_locations:"), str(exc.value)
    assert "/p/important" in str(exc.value)


def test_keys_inside_the_state_dir_are_refused(tmp_path: Path) -> None:
    text = f'[keys]\nkek_file = "{tmp_path}/state/kek"\n'
    with pytest.raises(ConfigError) as exc:
        load_config(cfg_file(tmp_path, text))
    assert str(exc.value).startswith("keys.kek_file:"), str(exc.value)
