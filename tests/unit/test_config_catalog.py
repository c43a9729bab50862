"""The catalog keys (catalog, node, catalog_pool_size), --catalog/--node, and the state
dir's binding to a shared catalog (mount.bind_catalog): every refusal names its key."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ckptfs import statedir
from ckptfs.catalog.binding import bind_catalog, node_tiers, redact
from ckptfs.config import SQLITE_CATALOG, config_from_dict, default_node, load_config
from ckptfs.errors import ConfigError

PG = "postgresql://ckptfs@db.example:5432/ckptfs"


def test_the_default_is_the_embedded_catalog_and_the_host_name() -> None:
    cfg = config_from_dict({})
    assert cfg.catalog.url == SQLITE_CATALOG and not cfg.catalog.shared
    assert cfg.catalog.node == default_node()
    assert default_node() == socket.gethostname().split(".")[0][:63] or "-" in default_node()


@pytest.mark.parametrize("url", [
    PG, "postgres://u@/db?host=/run/postgresql", "postgresql://u:secret@h/db?sslmode=require",
])
def test_postgresql_uris_are_accepted(url: str) -> None:
    cfg = config_from_dict({"catalog": url, "node": "a1", "catalog_pool_size": 8})
    assert cfg.catalog.shared and cfg.catalog.url == url and cfg.catalog.url_set
    assert cfg.catalog.node == "a1" and cfg.catalog.node_set and cfg.catalog.pool_size == 8


def test_the_session_timeout_defaults_to_15_s_with_a_heartbeat_at_a_fifth() -> None:
    assert config_from_dict({}).catalog.session_timeout_s == 15.0
    assert config_from_dict({}).catalog.heartbeat_s == 3.0
    cfg = config_from_dict({"catalog": PG, "session_timeout": 2})
    assert cfg.catalog.session_timeout_s == 2.0 and cfg.catalog.heartbeat_s == 0.4


@pytest.mark.parametrize(("data", "key"), [
    ({"catalog": "mysql://u@h/db"}, "catalog"),
    ({"catalog": "postgresql://u@h/"}, "catalog"),
    ({"catalog": "postgresql://u@h/a/b"}, "catalog"),
    ({"catalog": "/var/lib/ckptfs/catalog.sqlite"}, "catalog"),
    ({"catalog": 5}, "catalog"),
    ({"node": "a:b"}, "node"),
    ({"node": ""}, "node"),
    ({"node": "-a"}, "node"),
    ({"node": "x" * 64}, "node"),
    ({"catalog_pool_size": 0}, "catalog_pool_size"),
    ({"catalog_pool_size": 65}, "catalog_pool_size"),
    ({"peer_chunk_wait": -1}, "peer_chunk_wait"),
    ({"peer_chunk_wait": "30s"}, "peer_chunk_wait"),
    ({"session_timeout": 0.5}, "session_timeout"),
    ({"session_timeout": 3601}, "session_timeout"),
    ({"session_timeout": "15s"}, "session_timeout"),
    ({"session_timeout": True}, "session_timeout"),
])
def test_bad_catalog_keys_name_the_key(data: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    assert str(info.value).startswith(f"{key}:"), info.value


def test_peer_chunk_wait_defaults_to_tens_of_seconds() -> None:
    assert config_from_dict({}).reads.peer_wait_s == 30.0
    assert config_from_dict({"peer_chunk_wait": 0}).reads.peer_wait_s == 0.0


def test_command_line_flags_name_themselves(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="^--catalog:"):
        load_config(state_dir=tmp_path, catalog_url="sqlite3")
    with pytest.raises(ConfigError, match="^--node:"):
        load_config(state_dir=tmp_path, node="a b")
    cfg = load_config(state_dir=tmp_path, catalog_url=PG, node="b")
    assert cfg.catalog.url == PG and cfg.catalog.node == "b"


def test_a_state_dir_stays_bound_to_its_catalog_and_node(tmp_path: Path) -> None:
    statedir.ensure_state_dir(tmp_path / "s")
    cfg = load_config(state_dir=tmp_path / "s", catalog_url=PG, node="a")
    assert bind_catalog(cfg) == cfg  # not bound yet: as configured
    statedir.write_binding(cfg.state_dir, PG, "a")
    assert os.stat(cfg.state_dir / statedir.BINDING_FILE).st_mode & 0o777 == 0o600
    # A remount with only --state-dir uses the binding.
    again = bind_catalog(load_config(state_dir=tmp_path / "s"))
    assert again.catalog.url == PG and again.catalog.node == "a" and again.catalog.shared
    with pytest.raises(ConfigError, match="^catalog: .*serves the shared catalog"):
        bind_catalog(load_config(state_dir=tmp_path / "s", catalog_url=PG + "2"))
    with pytest.raises(ConfigError, match="^catalog: "):
        bind_catalog(load_config(state_dir=tmp_path / "s", catalog_url="sqlite"))
    with pytest.raises(ConfigError, match="^node: .*is node 'a'"):
        bind_catalog(load_config(state_dir=tmp_path / "s", node="b"))


def test_an_embedded_catalog_is_not_moved_into_a_shared_one(tmp_path: Path) -> None:
    cfg = load_config(state_dir=tmp_path, catalog_url=PG)
    cfg.catalog_path.write_bytes(b"")  # an existing SQLite catalog
    with pytest.raises(ConfigError, match="^catalog: .*embedded SQLite catalog"):
        bind_catalog(cfg)


def test_local_tiers_carry_the_node_name_only_with_a_shared_catalog(tmp_path: Path) -> None:
    local = load_config(state_dir=tmp_path, local_dirs=[str(tmp_path / "t0")])
    assert node_tiers(local) == local
    shared = load_config(state_dir=tmp_path, local_dirs=[str(tmp_path / "t0")],
                         catalog_url=PG, node="n7")
    named = node_tiers(shared)
    assert [t.name for t in named.tiers] == ["n7:local0"]
    assert node_tiers(named) == named  # already qualified (a recorded tier): unchanged
    assert dataclasses.replace(named, tiers=shared.tiers) == shared


def test_passwords_are_redacted() -> None:
    assert redact("postgresql://u:hunter2@h/db") == "postgresql://u:***@h/db"
    assert redact(PG) == PG


def test_mount_refuses_a_rebinding_with_exit_2(tmp_path: Path) -> None:
    state = tmp_path / "state"
    statedir.ensure_state_dir(state)
    statedir.write_binding(state, PG, "a")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    res = subprocess.run(
        [sys.executable, "-m", "ckptfs", "mount", str(mnt), "--state-dir", str(state),
         "--catalog", PG + "x"], capture_output=True, text=True, timeout=60,
    )
    assert res.returncode == 2, res.stderr
    assert "catalog:" in res.stderr and "serves the shared catalog" in res.stderr


def test_the_state_dir_records_its_session_ids_privately(tmp_path: Path) -> None:
    state = tmp_path / "s"
    statedir.ensure_state_dir(state)
    assert statedir.read_session_ids(state) == ("", "")  # none yet
    statedir.write_session_ids(state, "sid-1", "attempt-2")
    assert statedir.read_session_ids(state) == ("sid-1", "attempt-2")
    assert os.stat(state / statedir.SESSION_FILE).st_mode & 0o777 == 0o600
    statedir.write_session_ids(state, "attempt-2")
    assert statedir.read_session_ids(state) == ("attempt-2", "")
    assert not (state / (statedir.SESSION_FILE + ".tmp")).exists()
    # A damaged file names no session: the restart waits for the expiry, as before.
    for damaged in ("{", "[]", '{"sid": 7}', ""):
        (state / statedir.SESSION_FILE).write_text(damaged)
        assert statedir.read_session_ids(state) == ("", "")
