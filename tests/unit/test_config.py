"""Unit tests of ckptfs.config: sizes, strict validation, tier naming, embedded default.

No mount here. Every validation error must name the offending key at the start of its
message, so an operator can fix the file at once.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from tests.support.mountutil import Mount

from ckptfs import config as C
from ckptfs.catalog import open_catalog, recorded_tiers
from ckptfs.config import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_IO_THREADS,
    DEFAULT_MEMORY_BUDGET,
    DEFAULT_REMOTE_READ_CONCURRENCY,
    GiB,
    KiB,
    MiB,
    config_from_dict,
    load_config,
    parse_size,
)
from ckptfs.config.load import physical_memory
from ckptfs.errors import ConfigError


def tier(**kw: object) -> dict[str, object]:
    t: dict[str, object] = {"name": "fast", "kind": "local", "path": "/srv/nvme0"}
    t.update(kw)
    return t


def write(tmp_path: Path, text: str, name: str = "ckptfs.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# --------------------------------------------------------------------------- sizes


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (4194304, 4 * MiB),
        (0, 0),
        ("4194304", 4 * MiB),
        ("4MiB", 4 * MiB),
        ("4 MiB", 4 * MiB),
        ("4mib", 4 * MiB),
        ("512M", 512 * MiB),
        ("512MB", 512 * MiB),
        ("64KiB", 64 * KiB),
        ("64k", 64 * KiB),
        ("1.5GiB", int(1.5 * GiB)),
        ("2G", 2 * GiB),
        ("1TiB", 1024 * GiB),
        ("100B", 100),
        (" 8MiB ", 8 * MiB),
    ],
)
def test_parse_size_accepts(value: object, expected: int) -> None:
    assert parse_size(value, "chunk_size") == expected


@pytest.mark.parametrize(
    "value",
    [True, False, -1, "", "MiB", "4 XiB", "four", "-4MiB", "4MiBs", 4.0, None, [4], "1e6"],
)
def test_parse_size_rejects_and_names_key(value: object) -> None:
    with pytest.raises(ConfigError) as ei:
        parse_size(value, "tier[3].capacity")
    assert str(ei.value).startswith("tier[3].capacity")


# --------------------------------------------------------------------------- defaults


def test_defaults_from_empty_dict() -> None:
    cfg = config_from_dict({})
    assert cfg.store.chunk_size == DEFAULT_CHUNK_SIZE
    assert cfg.store.memory_budget == DEFAULT_MEMORY_BUDGET
    assert cfg.store.io_threads == DEFAULT_IO_THREADS
    assert cfg.reads.remote_concurrency == DEFAULT_REMOTE_READ_CONCURRENCY
    assert cfg.reads.page_cache_push is True
    assert config_from_dict({"page_cache_push": False}).reads.page_cache_push is False
    assert cfg.fuse.allow_other is (os.geteuid() == 0)  # a root daemon serves every user
    assert cfg.fuse.default_permissions is True
    assert cfg.tiers == ()
    assert cfg.state_dir.is_absolute()


def test_full_config_file(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        f"""
state_dir = "{tmp_path / "state"}"
chunk_size = "1MiB"
memory_budget = "64MiB"
io_threads = 2
allow_other = true

[[tier]]
name = "nvme0"
kind = "local"
path = "{tmp_path / "t0"}"
location = "rack1"
weight = 2
capacity = "64MiB"

[[tier]]
name = "nvme1"
kind = "local"
path = "{tmp_path / "t1"}"
""",
    )
    cfg = load_config(p)
    assert cfg.state_dir == tmp_path / "state"
    assert cfg.store.chunk_size == MiB
    assert cfg.store.memory_budget == 64 * MiB
    assert cfg.store.io_threads == 2
    assert cfg.fuse.allow_other is True
    assert [t.name for t in cfg.tiers] == ["nvme0", "nvme1"]
    t0, t1 = cfg.tiers
    assert t0.path == tmp_path / "t0" and t0.kind == "local"
    assert t0.location == "rack1" and t0.weight == 2.0 and t0.capacity == 64 * MiB
    assert t1.location == "local" and t1.weight == 1.0 and t1.capacity is None
    assert cfg.source == str(p)
    assert cfg.catalog_path == tmp_path / "state" / "catalog.sqlite"
    assert cfg.log_path == tmp_path / "state" / "ckptfs.log"


def test_embedded_default_tier_under_state_dir(tmp_path: Path) -> None:
    cfg = load_config(state_dir=tmp_path / "st")
    assert cfg.source == "<embedded default>"
    assert cfg.state_dir == tmp_path / "st"
    assert len(cfg.tiers) == 1
    (t,) = cfg.tiers
    assert t.name == "local0"
    assert t.kind == "local"
    assert t.path == tmp_path / "st" / "tiers" / "local0"


def test_state_dir_override_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_config(state_dir="relative/state")
    assert cfg.state_dir == tmp_path / "relative" / "state"
    assert cfg.tiers[0].path == tmp_path / "relative" / "state" / "tiers" / "local0"


def test_state_dir_override_beats_file(tmp_path: Path) -> None:
    p = write(tmp_path, f'state_dir = "{tmp_path / "from_file"}"\n')
    cfg = load_config(p, state_dir=tmp_path / "from_cli")
    assert cfg.state_dir == tmp_path / "from_cli"


def test_chunk_size_override(tmp_path: Path) -> None:
    p = write(tmp_path, 'chunk_size = "8MiB"\n')
    assert load_config(p, state_dir=tmp_path).store.chunk_size == 8 * MiB
    assert load_config(p, state_dir=tmp_path, chunk_size="1MiB").store.chunk_size == MiB
    assert load_config(state_dir=tmp_path, chunk_size=2 * MiB).store.chunk_size == 2 * MiB


def test_bad_chunk_size_override_names_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as ei:
        load_config(state_dir=tmp_path, chunk_size="lots")
    assert str(ei.value).startswith("chunk_size")


# --------------------------------------------------------------------------- --local


def test_local_dirs_named_local0_local1(tmp_path: Path) -> None:
    cfg = load_config(
        state_dir=tmp_path / "st", local_dirs=[str(tmp_path / "a"), str(tmp_path / "b")]
    )
    assert [t.name for t in cfg.tiers] == ["local0", "local1"]
    assert [t.path for t in cfg.tiers] == [tmp_path / "a", tmp_path / "b"]
    assert all(t.kind == "local" for t in cfg.tiers)
    # --local replaces the embedded default: no tier under the state dir.
    assert all(not str(t.path).startswith(str(tmp_path / "st")) for t in cfg.tiers)


def test_local_dirs_relative_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_config(state_dir=tmp_path / "st", local_dirs=["rel"])
    assert cfg.tiers[0].path == tmp_path / "rel"


def test_local_dirs_appended_after_file_tiers_without_name_clash(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        f"""
[[tier]]
name = "local0"
kind = "local"
path = "{tmp_path / "cfg0"}"
""",
    )
    cfg = load_config(
        p, state_dir=tmp_path / "st", local_dirs=[str(tmp_path / "a"), str(tmp_path / "b")]
    )
    names = [t.name for t in cfg.tiers]
    assert names[0] == "local0"
    assert len(set(names)) == 3
    assert [t.path for t in cfg.tiers] == [tmp_path / "cfg0", tmp_path / "a", tmp_path / "b"]


def test_same_path_for_two_tiers_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as ei:
        load_config(state_dir=tmp_path, local_dirs=[str(tmp_path / "a"), str(tmp_path / "a")])
    assert str(ei.value).startswith("tier[1].path")


# --------------------------------------------------------------------------- validation


TOP_LEVEL_ERRORS = [
    ({"bogus": 1}, "bogus"),
    ({"chunk_size": "lots"}, "chunk_size"),
    ({"chunk_size": 1000}, "chunk_size"),  # not a multiple of 4096
    ({"chunk_size": "32KiB"}, "chunk_size"),  # below the minimum
    ({"chunk_size": "128MiB"}, "chunk_size"),  # above the maximum
    ({"chunk_size": True}, "chunk_size"),
    ({"memory_budget": "1MiB"}, "memory_budget"),  # less than two chunks
    ({"memory_budget": "x"}, "memory_budget"),
    ({"io_threads": 0}, "io_threads"),
    ({"io_threads": 257}, "io_threads"),
    ({"io_threads": "4"}, "io_threads"),
    ({"io_threads": True}, "io_threads"),
    ({"io_threads": 2.0}, "io_threads"),
    ({"remote_read_concurrency": 0}, "remote_read_concurrency"),
    ({"remote_read_concurrency": 257}, "remote_read_concurrency"),
    ({"remote_read_concurrency": "8"}, "remote_read_concurrency"),
    ({"page_cache_push": "yes"}, "page_cache_push"),
    ({"page_cache_push": 1}, "page_cache_push"),
    ({"allow_other": "yes"}, "allow_other"),
    ({"allow_other": 1}, "allow_other"),
    ({"default_permissions": "no"}, "default_permissions"),
    ({"state_dir": "relative/dir"}, "state_dir"),
    ({"state_dir": ""}, "state_dir"),
    ({"state_dir": 5}, "state_dir"),
    ({"tier": "nvme"}, "tier"),
    ({"tier": {"name": "x"}}, "tier"),
]

TIER_ERRORS = [
    ([tier(speed=3)], "tier[0].speed"),
    ([tier(), tier(name="other", path="/srv/b", colour="red")], "tier[1].colour"),
    ([{"kind": "local", "path": "/x"}], "tier[0].name"),
    ([{"name": "a", "path": "/x"}], "tier[0].kind"),
    ([{"name": "a", "kind": "local"}], "tier[0].path"),
    ([tier(name="")], "tier[0].name"),
    ([tier(name="has space")], "tier[0].name"),
    ([tier(name="a/b")], "tier[0].name"),
    ([tier(name="x" * 65)], "tier[0].name"),
    ([tier(name=7)], "tier[0].name"),
    ([tier(kind="s3")], "tier[0].path"),  # a local-only key on an s3 tier
    ([tier(kind="tape")], "tier[0].kind"),
    ([tier(kind="")], "tier[0].kind"),
    ([tier(path="relative/dir")], "tier[0].path"),
    ([tier(path="")], "tier[0].path"),
    ([tier(path=3)], "tier[0].path"),
    ([tier(location="")], "tier[0].location"),
    ([tier(weight=0)], "tier[0].weight"),
    ([tier(weight=-1.5)], "tier[0].weight"),
    ([tier(weight="heavy")], "tier[0].weight"),
    ([tier(weight=True)], "tier[0].weight"),
    ([tier(capacity=0)], "tier[0].capacity"),
    ([tier(capacity="0MiB")], "tier[0].capacity"),
    ([tier(capacity="big")], "tier[0].capacity"),
    ([tier(capacity=-5)], "tier[0].capacity"),
    ([tier(), tier(path="/srv/other")], "tier[1].name"),  # duplicate name
    (["not-a-table"], "tier[0]"),
]


@pytest.mark.parametrize(
    ("data", "key"), TOP_LEVEL_ERRORS + [({"tier": t}, k) for t, k in TIER_ERRORS]
)
def test_validation_error_names_key(data: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as ei:
        config_from_dict(data)
    msg = str(ei.value)
    assert msg.startswith(key), msg
    # The key is followed by a separator, not a longer key that merely starts the same.
    assert msg[len(key)] in ":. ", msg


@pytest.mark.parametrize("weight", [math.nan, math.inf])
def test_non_finite_weight_rejected(weight: float) -> None:
    # TOML allows `weight = nan` and `weight = inf`; neither is a usable placement weight.
    with pytest.raises(ConfigError) as ei:
        config_from_dict({"tier": [tier(weight=weight)]})
    assert str(ei.value).startswith("tier[0].weight")


def test_unknown_key_error_lists_allowed_keys() -> None:
    with pytest.raises(ConfigError) as ei:
        config_from_dict({"chunksize": "4MiB"})
    assert "chunk_size" in str(ei.value)


def test_validation_through_toml_file(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        """
[[tier]]
name = "a"
kind = "local"
path = "/srv/a"
speed = "fast"
""",
    )
    with pytest.raises(ConfigError) as ei:
        load_config(p, state_dir=tmp_path)
    assert str(ei.value).startswith("tier[0].speed")


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as ei:
        load_config(tmp_path / "nope.toml")
    assert str(ei.value).startswith("--config")
    assert "nope.toml" in str(ei.value)


def test_config_path_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as ei:
        load_config(tmp_path)
    assert str(ei.value).startswith("--config")


def test_invalid_toml_syntax(tmp_path: Path) -> None:
    p = write(tmp_path, "chunk_size = = 4\n")
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    assert str(p) in str(ei.value)
    assert "TOML" in str(ei.value)


def test_non_utf8_config_file(tmp_path: Path) -> None:
    # TOML must be UTF-8; a stray Latin-1 byte must be a ConfigError, not a traceback.
    p = tmp_path / "latin1.toml"
    p.write_bytes(b'state_dir = "/tmp/caf\xe9"\n')
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    assert str(p) in str(ei.value) or str(ei.value).startswith("--config")


def test_config_error_is_einval() -> None:
    import errno

    assert ConfigError("x").errno == errno.EINVAL


def test_config_is_frozen(tmp_path: Path) -> None:
    cfg = load_config(state_dir=tmp_path)
    with pytest.raises(AttributeError):
        cfg.store.chunk_size = 1  # type: ignore[misc]
    with pytest.raises(AttributeError):
        cfg.store = cfg.store  # type: ignore[misc]


def test_default_state_dir_for_root_or_user(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert C.default_state_dir() == Path("/var/lib/ckptfs")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert C.default_state_dir() == tmp_path / "xdg" / "ckptfs"


def test_the_documented_full_example_is_a_valid_config() -> None:
    import tomllib

    from ckptfs.config import config_from_dict

    doc = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    block = doc.split("## Full example", 1)[1].split("```toml", 1)[1].split("```", 1)[0]
    cfg = config_from_dict(tomllib.loads(block), "docs/configuration.md")
    assert [t.name for t in cfg.tiers] == ["nvme0", "nvme1"]
    assert [t.name for t in cfg.remote_tiers] == ["s3a"]
    assert [(p.path, p.durability) for p in cfg.policies] == [("/final", "remote")]


# --------------------------------------------------------------------------- tier directories


@pytest.mark.parametrize("key", ["create", "allow_shared_device", "direct_io"])
@pytest.mark.parametrize("value", ["yes", 1, "true"])
def test_tier_flags_must_be_booleans_and_name_the_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError) as ei:
        config_from_dict({"tier": [tier(), tier(name="b", path="/srv/b", **{key: value})]})
    assert str(ei.value).startswith(f"tier[1].{key}: expected true or false")


def test_tier_io_keys(tmp_path: Path) -> None:
    a, b = config_from_dict({"tier": [
        tier(), tier(name="b", path="/srv/b", direct_io=False, verify_writes="device"),
    ]}).tiers
    assert (a.direct_io, a.verify_writes) == (True, "memory")
    assert (b.direct_io, b.verify_writes) == (False, "device")
    with pytest.raises(ConfigError) as ei:
        config_from_dict({"tier": [tier(verify_writes="disk")]})
    assert str(ei.value).startswith("tier[0].verify_writes: expected one of memory, device")


def test_tier_flags_from_the_file_and_the_command_line(tmp_path: Path) -> None:
    p = write(tmp_path, f'[[tier]]\nname = "a"\nkind = "local"\npath = "{tmp_path / "a"}"\n'
                        'create = true\nallow_shared_device = true\n'
                        f'[[tier]]\nname = "b"\nkind = "local"\npath = "{tmp_path / "b"}"\n')
    a, b = load_config(p, state_dir=tmp_path / "st").tiers
    assert (a.create, a.allow_shared_device, a.origin) == (True, True, "tier[0]")
    assert (b.create, b.allow_shared_device) == (False, False)
    # --create / --allow-shared-device: on every local tier, the file's and --local ones.
    cfg = load_config(p, state_dir=tmp_path / "st", local_dirs=[str(tmp_path / "c")],
                      create_tiers=True, allow_shared_device=True)
    assert all(t.create and t.allow_shared_device for t in cfg.tiers)
    assert cfg.tiers[2].origin == "--local"
    # The embedded default is ckptfs's own directory: it creates it without being told.
    (default,) = load_config(state_dir=tmp_path / "st").tiers
    assert default.create and not default.allow_shared_device


def _prepare(tiers: list[C.TierConfig]) -> dict[str, list[str]]:
    from ckptfs.preflight import prepare_local_tiers

    return prepare_local_tiers(tiers)


def test_missing_tier_directory_is_refused_unless_create(tmp_path: Path) -> None:
    from ckptfs.errors import UsageError

    p = write(tmp_path, f'[[tier]]\nname = "nvme1"\nkind = "local"\npath = "{tmp_path / "nvme1"}"\n')
    cfg = load_config(p, state_dir=tmp_path / "st")
    with pytest.raises(UsageError) as ei:
        _prepare(list(cfg.tiers))
    assert str(ei.value).startswith(f"tier[0].path: {tmp_path / 'nvme1'} does not exist")
    assert "tier[0].create = true" in str(ei.value)
    assert not (tmp_path / "nvme1").exists()
    cfg = load_config(state_dir=tmp_path / "st", local_dirs=[str(tmp_path / "x")])
    with pytest.raises(UsageError, match=r"^--local: .* does not exist.*--create"):
        _prepare(list(cfg.tiers))
    cfg = load_config(p, state_dir=tmp_path / "st", create_tiers=True)
    assert _prepare(list(cfg.tiers)) == {}
    assert (tmp_path / "nvme1").is_dir()
    assert (tmp_path / "nvme1").stat().st_mode & 0o777 == 0o700


def test_tiers_on_one_device_are_refused_unless_all_allow_it(tmp_path: Path) -> None:
    from ckptfs.errors import UsageError

    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    text = (f'[[tier]]\nname = "a"\nkind = "local"\npath = "{tmp_path / "a"}"\n{{}}'
            f'[[tier]]\nname = "b"\nkind = "local"\npath = "{tmp_path / "b"}"\n')
    p = write(tmp_path, text.format(""))
    with pytest.raises(UsageError) as ei:
        _prepare(list(load_config(p, state_dir=tmp_path / "st").tiers))
    assert str(ei.value).startswith(f"tier[0].path: {tmp_path / 'a'} is on the same device as tier b")
    assert "tier[0].allow_shared_device = true" in str(ei.value)
    # Allowed on one tier only: the other one is named.
    p = write(tmp_path, text.format("allow_shared_device = true\n"))
    with pytest.raises(UsageError, match=r"^tier\[1\]\.path: .*tier\[1\]\.allow_shared_device"):
        _prepare(list(load_config(p, state_dir=tmp_path / "st").tiers))
    cfg = load_config(p, state_dir=tmp_path / "st", allow_shared_device=True)
    assert _prepare(list(cfg.tiers)) == {"a": ["b"], "b": ["a"]}


def test_upload_during_save() -> None:
    assert config_from_dict({}).upload.during_save == "auto"
    assert config_from_dict({"upload_during_save": "defer"}).upload.during_save == "defer"
    with pytest.raises(ConfigError) as ei:
        config_from_dict({"upload_during_save": "sometimes"})
    assert str(ei.value).startswith("upload_during_save: expected one of auto, defer, overlap")


def test_recorded_tiers_are_read_from_the_catalog_without_changing_it(tmp_path: Path) -> None:
    assert recorded_tiers(tmp_path) == ((), ())  # no catalog yet
    cat = open_catalog(tmp_path / "catalog.sqlite")
    assert recorded_tiers(tmp_path) == ((), ())  # a catalog that never recorded tiers
    cat.set_meta("tiers", json.dumps([
        {"name": "nvme0", "kind": "local", "path": str(tmp_path / "t0"), "location": "local",
         "direct_io": False},
        {"name": "s3", "kind": "s3", "bucket": "b", "prefix": "p/", "location": "remote"},
    ]))
    cat.close()
    before = (tmp_path / "catalog.sqlite").read_bytes()
    local, remote = recorded_tiers(tmp_path)
    assert [(t.name, t.path, t.direct_io, t.origin) for t in local] == [
        ("nvme0", tmp_path / "t0", False, "recorded")]
    assert [(t.name, t.bucket, t.prefix) for t in remote] == [("s3", "b", "p/")]
    assert (tmp_path / "catalog.sqlite").read_bytes() == before
    (tmp_path / "catalog.sqlite").write_bytes(b"not a database")
    assert recorded_tiers(tmp_path) == ((), ())


def test_load_config_mounts_the_recorded_tiers_only_through_the_reader_it_is_given(
    tmp_path: Path,
) -> None:
    cat = open_catalog(tmp_path / "catalog.sqlite")
    cat.set_meta("tiers", json.dumps([
        {"name": "nvme0", "kind": "local", "path": str(tmp_path / "t0"), "location": "local"},
    ]))
    cat.close()
    # The CLI passes the catalog's reader: a remount with only --state-dir gets its tiers.
    (t,) = load_config(state_dir=tmp_path, recorded=recorded_tiers).tiers
    assert (t.name, t.path, t.origin) == ("nvme0", tmp_path / "t0", "recorded")
    # Any tier given (--local here) wins over the recorded ones, as before.
    (t,) = load_config(state_dir=tmp_path, local_dirs=[str(tmp_path / "x")],
                       recorded=recorded_tiers).tiers
    assert t.origin == "--local"
    # Without a reader config opens no catalog: the embedded default.
    (t,) = load_config(state_dir=tmp_path).tiers
    assert t.origin == "default"


def test_write_behind_key() -> None:
    assert config_from_dict({}).store.write_behind == "never"
    assert config_from_dict({"write_behind": "auto"}).store.write_behind == "auto"
    with pytest.raises(ConfigError, match="write_behind: expected one of"):
        config_from_dict({"write_behind": "sometimes"})


# --------------------------------------------------------------------------- size bounds


@pytest.mark.parametrize("value", ["99999999999999999999TiB", "9" * 400, 2**63, "8388608TiB"])
def test_a_size_past_the_catalogs_integers_is_refused_naming_the_key(value: object) -> None:
    with pytest.raises(ConfigError) as ei:
        parse_size(value, "tier[0].capacity")
    assert str(ei.value).startswith("tier[0].capacity")


def test_sizes_are_exact() -> None:
    assert parse_size("9007199254740993B", "k") == 2**53 + 1  # a float loses the last digit
    assert parse_size(2**63 - 1, "k") == 2**63 - 1


def test_a_memory_budget_past_the_machines_memory_is_refused() -> None:
    ram = physical_memory()
    assert ram is not None and ram > 0
    assert config_from_dict({"memory_budget": ram}).store.memory_budget == ram
    for value in (ram + 4096, "99999999999999999999TiB", "1024TiB"):
        with pytest.raises(ConfigError) as ei:
            config_from_dict({"memory_budget": value})
        assert str(ei.value).startswith("memory_budget"), ei.value


def test_the_cli_exits_2_naming_memory_budget(tmp_path: Path) -> None:
    cfg = tmp_path / "ckptfs.toml"
    cfg.write_text('memory_budget = "99999999999999999999TiB"\n')
    m = Mount(tmp_path / "mnt", tmp_path / "state", [], ("--config", str(cfg)))
    try:
        with pytest.raises(RuntimeError) as ei:  # a mount that worked is cleaned up below
            m.start()
    finally:
        m.cleanup()
    assert "ckptfs mount failed (2)" in str(ei.value), ei.value
    assert "memory_budget" in str(ei.value) and "Traceback" not in str(ei.value), ei.value
