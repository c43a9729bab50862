"""Loading a config: the TOML file, then command-line overrides, then defaults, checked
strictly into the model (model.py).

Every error names the offending key (``tier[1].path``) so an operator can fix it at once.
Unknown keys are errors: a typo must never silently fall back to a default.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import tomllib
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .checkpoints import patterns_from_config, policies_from_config
from .drill import drill_from_config
from .governance import check_governance, governance_from_config, namespace_retention
from .model import (
    CATALOG_SCHEMES,
    COPY_BACK,
    DEFAULT_CATALOG_POOL_SIZE,
    DEFAULT_CHUNK_SIZE,
    DEFAULT_IO_THREADS,
    DEFAULT_MEMORY_BUDGET,
    DEFAULT_METRICS_ADDRESS,
    DEFAULT_PEER_CHUNK_WAIT_S,
    DEFAULT_READAHEAD,
    DEFAULT_REMOTE_READ_CONCURRENCY,
    DEFAULT_SESSION_TIMEOUT_S,
    DURABILITIES,
    MAX_CHUNK_SIZE,
    MIN_CHUNK_SIZE,
    ON_LOCAL_FULL,
    REMOTE_COMPRESSION_MODES,
    SQLITE_CATALOG,
    UPLOAD_DURING_SAVE,
    WRITE_BEHIND,
    CatalogConfig,
    CheckpointConfig,
    Config,
    DurabilityPolicy,
    FuseConfig,
    GiB,
    GovernanceConfig,
    MetricsConfig,
    PatternConfig,
    ReadConfig,
    RetentionConfig,
    S3TierConfig,
    StoreConfig,
    TierConfig,
    UploadConfig,
)
from .parse import (
    array_of_tables,
    choice,
    int_key,
    parse_metrics_address,
    parse_size,
    seconds,
    take_bool,
    take_str,
)
from .scrub import scrub_from
from .tiers import local_tiers_from_paths, parse_remote_url, tier_from_table

# The tiers a state dir's catalog was last mounted with (local, remote): the catalog reads
# them (ckptfs.catalog.recorded_tiers); the caller passes that in, config reads no catalog.
RecordedTiers = Callable[[Path], tuple[tuple[TierConfig, ...], tuple[S3TierConfig, ...]]]


def default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/ckptfs")
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "ckptfs"


_TOP_KEYS = {
    "state_dir", "chunk_size", "memory_budget", "io_threads", "allow_other",
    "default_permissions", "tier",
    "remote_copies", "upload_concurrency", "upload_during_save", "on_local_full",
    "local_full_timeout", "policy",
    "remote_compression", "readahead", "copy_back", "remote_read_concurrency", "page_cache_push", "checkpoints", "checkpoint_partial_after",
    "checkpoint_pattern", "retention", "local_high_watermark", "metrics_address",
    "catalog", "node", "catalog_pool_size", "peer_chunk_wait", "session_timeout",
    "write_behind", "namespace", "access", "keys", "audit", "scrub", "drill",
}
_POLICY_KEYS = {"path", "durability", "timeout"}


def _policies_from(raw: object) -> tuple[DurabilityPolicy, ...]:
    out: list[DurabilityPolicy] = []
    for where, table in array_of_tables(raw, "policy", _POLICY_KEYS, ("path", "durability")):
        path = table["path"]
        if not isinstance(path, str) or not path.startswith("/") or "\x00" in path:
            raise ConfigError(
                f"{where}.path: expected a path inside the mount starting with '/', got {path!r}"
            )
        parts = [p for p in path.split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise ConfigError(f"{where}.path: '.' and '..' are not allowed, got {path!r}")
        norm = "/" + "/".join(parts)
        if any(p.path == norm for p in out):
            raise ConfigError(f"{where}.path: {norm!r} has two policies")
        out.append(DurabilityPolicy(
            norm,
            choice(table["durability"], f"{where}.durability", DURABILITIES),
            seconds(table.get("timeout", 600), f"{where}.timeout", 0.001, 7 * 86400),
        ))
    return tuple(out)


_NODE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


def default_node() -> str:
    """This host's name (its first label), as a node name."""
    host = socket.gethostname().split(".")[0]
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "-", host).strip("-.") or "node"
    return cleaned[:63]


def parse_node(value: object, key: str = "node") -> str:
    if not isinstance(value, str) or not _NODE_RE.fullmatch(value):
        raise ConfigError(
            f"{key}: expected a node name of 1-63 of [A-Za-z0-9_.-] starting with a letter or "
            f"digit, got {value!r}"
        )
    return value


def parse_catalog_url(value: object, key: str = "catalog") -> str:
    """``sqlite`` or a PostgreSQL libpq URI with a database name
    (postgresql://USER@HOST:PORT/DB, postgresql://USER@/DB?host=/run/postgresql)."""
    if value == SQLITE_CATALOG:
        return SQLITE_CATALOG
    if not isinstance(value, str) or "://" not in value:
        raise ConfigError(
            f"{key}: expected \"sqlite\" or a URI postgresql://USER@HOST/DATABASE, got {value!r}"
        )
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in CATALOG_SCHEMES:
        raise ConfigError(
            f"{key}: unknown catalog engine {parts.scheme!r} (\"sqlite\" or postgresql://...)"
        )
    if not parts.path.strip("/") or "/" in parts.path.strip("/"):
        raise ConfigError(f"{key}: the URI names no database (postgresql://USER@HOST/DATABASE)")
    if parts.fragment:
        raise ConfigError(f"{key}: a catalog URI has no #fragment")
    return value


def physical_memory() -> int | None:
    """This machine's physical memory in bytes (None where the system does not say)."""
    try:
        pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None
    return pages * page if pages > 0 and page > 0 else None


def config_from_dict(data: dict[str, Any], source: str = "<dict>") -> Config:
    for key in data:
        if key not in _TOP_KEYS:
            raise ConfigError(f"{key}: unknown key (allowed: {', '.join(sorted(_TOP_KEYS))})")
    state_dir = _state_dir_from(data)
    store = _store_from(data)
    upload = UploadConfig(
        concurrency=int_key(data, "upload_concurrency", 8, 1, 256),
        during_save=choice(data.get("upload_during_save", "auto"), "upload_during_save",
                           UPLOAD_DURING_SAVE, quoted=False),
        compression=choice(data.get("remote_compression", "auto"), "remote_compression",
                           REMOTE_COMPRESSION_MODES, quoted=False),
    )
    reads = _reads_from(data)
    checkpoints = _checkpoints_from(data)
    governance = governance_from_config(data)
    retention = _retention_from(data, governance)
    policies = _policies_from(data.get("policy", []))
    metrics_address = parse_metrics_address(data.get("metrics_address", DEFAULT_METRICS_ADDRESS))
    catalog = _catalog_from(data)
    # A root daemon serves the users training jobs run as (like JuiceFS): allow_other.
    allow_other = take_bool(data.get("allow_other", os.geteuid() == 0), "allow_other")
    default_permissions = take_bool(data.get("default_permissions", True), "default_permissions")
    tiers, remote_tiers = _tiers_from(data)
    return Config(
        state_dir=state_dir,
        tiers=tiers,
        remote_tiers=remote_tiers,
        store=store,
        upload=upload,
        reads=reads,
        checkpoints=checkpoints,
        retention=retention,
        policies=policies,
        fuse=FuseConfig(allow_other=allow_other, default_permissions=default_permissions),
        metrics=MetricsConfig(address=metrics_address),
        scrub=scrub_from(data),
        catalog=catalog,
        governance=governance,
        drill=drill_from_config(data),
        source=source,
    )


def _state_dir_from(data: dict[str, Any]) -> Path:
    state_dir = default_state_dir()
    if "state_dir" in data:
        state_dir = Path(take_str(data, "state_dir", "state_dir"))
        if not state_dir.is_absolute():
            raise ConfigError(f"state_dir: must be an absolute path, got {str(state_dir)!r}")
    return state_dir


def _store_from(data: dict[str, Any]) -> StoreConfig:
    """Chunks, the memory they may take, the I/O threads, copies, a full local tier."""
    chunk_size = parse_size(data.get("chunk_size", DEFAULT_CHUNK_SIZE), "chunk_size")
    if not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE or chunk_size % 4096:
        raise ConfigError(
            f"chunk_size: {chunk_size} must be a multiple of 4096 between "
            f"{MIN_CHUNK_SIZE} and {MAX_CHUNK_SIZE}"
        )
    memory_budget = parse_size(data.get("memory_budget", DEFAULT_MEMORY_BUDGET), "memory_budget")
    if memory_budget < 2 * chunk_size:
        raise ConfigError(
            f"memory_budget: {memory_budget} must hold at least two chunks ({2 * chunk_size})"
        )
    ram = physical_memory()
    if ram is not None and memory_budget > ram:
        # Chunk buffers are allocated as writers fill them: a budget past the machine's
        # memory is no bound at all, and the daemon would be killed for memory instead.
        raise ConfigError(
            f"memory_budget: {memory_budget} is more than this machine's memory ({ram} bytes)"
        )
    io_threads = int_key(data, "io_threads", DEFAULT_IO_THREADS, 1, 256)
    remote_copies = int_key(data, "remote_copies", 1, 1, 16)
    on_local_full = choice(data.get("on_local_full", "block"), "on_local_full", ON_LOCAL_FULL)
    write_behind = choice(data.get("write_behind", StoreConfig.write_behind), "write_behind",
                          WRITE_BEHIND)
    local_full_timeout_s = seconds(
        data.get("local_full_timeout", 600), "local_full_timeout", 0.001, 7 * 86400
    )
    return StoreConfig(
        chunk_size=chunk_size, chunk_size_set="chunk_size" in data,
        memory_budget=memory_budget, io_threads=io_threads,
        remote_copies=remote_copies, on_local_full=on_local_full,
        local_full_timeout_s=local_full_timeout_s, write_behind=write_behind,
    )


def _reads_from(data: dict[str, Any]) -> ReadConfig:
    readahead = parse_size(data.get("readahead", DEFAULT_READAHEAD), "readahead")
    if readahead > 4 * GiB:
        raise ConfigError(f"readahead: {readahead} is more than 4 GiB")
    copy_back = choice(data.get("copy_back", "sequential"), "copy_back", COPY_BACK)
    page_cache_push = take_bool(data.get("page_cache_push", True), "page_cache_push")
    remote_reads = int_key(data, "remote_read_concurrency", DEFAULT_REMOTE_READ_CONCURRENCY,
                           1, 256)
    peer_wait = seconds(data.get("peer_chunk_wait", DEFAULT_PEER_CHUNK_WAIT_S), "peer_chunk_wait",
                        0, 3600)
    return ReadConfig(readahead=readahead, copy_back=copy_back,
                      remote_concurrency=remote_reads, peer_wait_s=peer_wait,
                      page_cache_push=page_cache_push)


def _checkpoints_from(data: dict[str, Any]) -> CheckpointConfig:
    checkpoints = take_bool(data.get("checkpoints", True), "checkpoints")
    partial_after = seconds(
        data.get("checkpoint_partial_after", 600), "checkpoint_partial_after", 0.001, 7 * 86400
    )
    patterns: tuple[PatternConfig, ...] = ()
    if "checkpoint_pattern" in data:
        patterns = patterns_from_config(data["checkpoint_pattern"])
    return CheckpointConfig(enabled=checkpoints, partial_after_s=partial_after,
                            patterns=patterns)


def _retention_from(data: dict[str, Any], governance: GovernanceConfig) -> RetentionConfig:
    hwm = data.get("local_high_watermark", 0.9)
    if isinstance(hwm, bool) or not isinstance(hwm, int | float) or not 0.5 <= hwm <= 0.99:
        raise ConfigError(f"local_high_watermark: expected a fraction from 0.5 to 0.99, got {hwm!r}")
    retention = namespace_retention(governance, policies_from_config(data.get("retention", [])))
    return RetentionConfig(policies=retention, local_high_watermark=float(hwm))


def _catalog_from(data: dict[str, Any]) -> CatalogConfig:
    return CatalogConfig(
        url=parse_catalog_url(data.get("catalog", SQLITE_CATALOG)),
        url_set="catalog" in data,
        node=parse_node(data["node"]) if "node" in data else default_node(),
        node_set="node" in data,
        pool_size=int_key(data, "catalog_pool_size", DEFAULT_CATALOG_POOL_SIZE, 1, 64),
        session_timeout_s=seconds(data.get("session_timeout", DEFAULT_SESSION_TIMEOUT_S),
                                  "session_timeout", 1, 3600),
    )


def _tiers_from(data: dict[str, Any]) -> tuple[tuple[TierConfig, ...], tuple[S3TierConfig, ...]]:
    """The ``[[tier]]`` tables: (local tiers, remote tiers), names unique across both."""
    raw_tiers = data.get("tier", [])
    if not isinstance(raw_tiers, list):
        raise ConfigError("tier: expected an array of tables ([[tier]])")
    all_tiers = [tier_from_table(t, i) for i, t in enumerate(raw_tiers)]
    names = [t.name for t in all_tiers]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ConfigError(f"tier[{i}].name: duplicate tier name {name!r}")
    tiers = tuple(t for t in all_tiers if isinstance(t, TierConfig))
    remote_tiers = tuple(t for t in all_tiers if isinstance(t, S3TierConfig))
    return tiers, remote_tiers


def load_config(
    path: str | Path | None = None,
    *,
    state_dir: str | Path | None = None,
    local_dirs: list[str] | None = None,
    chunk_size: str | int | None = None,
    remote_urls: list[str] | None = None,
    create_tiers: bool = False,
    allow_shared_device: bool = False,
    recorded: RecordedTiers | None = None,
    catalog_url: str | None = None,
    node: str | None = None,
) -> Config:
    """Build the effective config: file (if any), then command-line overrides, then defaults.

    With no file and no ``--local``, the tiers recorded in an existing catalog apply (so a
    remount needs only ``--state-dir``), as ``recorded`` reads them (the CLI passes
    ``ckptfs.catalog.recorded_tiers``; None reads no catalog); for a new state dir, the
    embedded default: one local tier under the state directory. Remote tiers (``[[tier]]`` of kind "s3", and
    ``--remote`` URLs, named remote0, remote1, ... after the file's tiers) never replace
    the local ones. ``create_tiers`` / ``allow_shared_device`` (``--create``,
    ``--allow-shared-device``) set ``create`` / ``allow_shared_device`` on every local tier.
    """
    data, source = _file_with_flags(path, state_dir, chunk_size, catalog_url, node)
    cfg = config_from_dict(data, source)
    tiers = cfg.tiers
    if local_dirs:
        tiers = tiers + _local_dir_tiers(local_dirs, tiers, cfg.remote_tiers)
    remote_tiers = cfg.remote_tiers
    if not tiers and not remote_tiers and not remote_urls and recorded is not None:
        # A remount with only --state-dir: the tiers the catalog was last mounted with.
        tiers, remote_tiers = recorded(cfg.state_dir)
    if not tiers:
        # The embedded default lives in the state dir, which ckptfs creates itself.
        tiers = (TierConfig(name="local0", kind="local", path=cfg.state_dir / "tiers" / "local0",
                            create=True, origin="default"),)
    if create_tiers or allow_shared_device:
        tiers = tuple(
            dataclasses.replace(t, create=t.create or create_tiers,
                                allow_shared_device=t.allow_shared_device or allow_shared_device)
            for t in tiers
        )
    _check_unique_paths(tiers)
    if remote_urls:
        remote_tiers = remote_tiers + _remote_url_tiers(remote_urls, tiers, remote_tiers)
    # Everything else as the file (and the flags above) set it.
    out = dataclasses.replace(cfg, tiers=tiers, remote_tiers=remote_tiers, source=source)
    check_governance(out)
    return out


def _file_with_flags(
    path: str | Path | None, state_dir: str | Path | None, chunk_size: str | int | None,
    catalog_url: str | None, node: str | None,
) -> tuple[dict[str, Any], str]:
    """The config file's table (empty without one) with the command-line flags that
    override its settings applied, and where it came from."""
    data: dict[str, Any] = {}
    source = "<embedded default>"
    if path is not None:
        data = _read_toml(path)
        source = str(path)
    if state_dir is not None:
        data["state_dir"] = str(Path(state_dir).expanduser().absolute())
    if chunk_size is not None:
        data["chunk_size"] = chunk_size
    if catalog_url is not None:
        data["catalog"] = parse_catalog_url(catalog_url, "--catalog")
    if node is not None:
        data["node"] = parse_node(node, "--node")
    return data, source


def _check_unique_paths(tiers: tuple[TierConfig, ...]) -> None:
    paths = [t.path for t in tiers]
    for i, p in enumerate(paths):
        if p in paths[:i]:
            raise ConfigError(f"tier[{i}].path: {p} is used by two tiers")


def _read_toml(path: str | Path) -> dict[str, Any]:
    """The config file as TOML; ConfigError naming the file (or --config) if it cannot be."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"--config: no such file: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"--config: cannot read {path}: {exc.strerror}") from None


def _local_dir_tiers(
    local_dirs: list[str], tiers: tuple[TierConfig, ...], remote_tiers: tuple[S3TierConfig, ...],
) -> tuple[TierConfig, ...]:
    """``--local`` directories as tiers, renamed local<N> past the names already taken."""
    extra = local_tiers_from_paths(local_dirs)
    taken = {t.name for t in tiers} | {t.name for t in remote_tiers}
    renamed = []
    for i, t in enumerate(extra):
        name = t.name
        n = i
        while name in taken:
            n += 1
            name = f"local{n}"
        taken.add(name)
        renamed.append(dataclasses.replace(t, name=name))
    return tuple(renamed)


def _remote_url_tiers(
    remote_urls: list[str], tiers: tuple[TierConfig, ...], remote_tiers: tuple[S3TierConfig, ...],
) -> tuple[S3TierConfig, ...]:
    """``--remote`` URLs as tiers named remote0, remote1, ... past the names already taken."""
    taken = {t.name for t in tiers} | {t.name for t in remote_tiers}
    added = []
    n = 0
    for url in remote_urls:
        while f"remote{n}" in taken:
            n += 1
        name = f"remote{n}"
        taken.add(name)
        added.append(parse_remote_url(url, name))
    return tuple(added)
