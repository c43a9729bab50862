"""Configuration: TOML loaded into frozen dataclasses, validated strictly.

Every error names the offending key (``tier[1].path``) so an operator can fix it at once.
Unknown keys are errors: a typo must never silently fall back to a default.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tomllib
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .catalog.catalog import CATALOG_FILE, read_recorded_tiers
from .errors import ConfigError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# Chosen by measurement (docs/performance.md, chunk-size sweep): 16 MiB was the fastest or
# near-fastest size for every write and read test; smaller chunks pay per-chunk costs (a
# thread hop, a frame file create + rename + fsync, a catalog row) that show, and 32 MiB
# was no faster. A partial-chunk read-modify-write of 16 MiB still takes only milliseconds.
DEFAULT_CHUNK_SIZE = 16 * MiB
# Chunk buffers of files being written; half as much again is the decoded-chunk cache.
DEFAULT_MEMORY_BUDGET = 1 * GiB
DEFAULT_IO_THREADS = 4
# Six 16 MiB chunks in flight per sequential reader: two (32 MiB) left a cold read waiting
# on each device read (performance.md, "Read path").
DEFAULT_READAHEAD = 96 * MiB
MIN_CHUNK_SIZE = 64 * KiB
# lz4 for the copy sent to a remote tier (ckptfs/codec/compress.py): "auto" compresses a
# chunk only when a sample says it pays, "off" never, "always" whenever it is smaller.
REMOTE_COMPRESSION_MODES = ("auto", "off", "always")
MAX_CHUNK_SIZE = 64 * MiB
# Prometheus metrics (ckptfs/metrics.py): localhost only unless configured otherwise.
DEFAULT_METRICS_ADDRESS = "127.0.0.1:9464"

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": KiB, "M": MiB, "G": GiB, "T": 1024 * GiB}
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def parse_size(value: object, key: str) -> int:
    """Parse ``4194304``, ``"4MiB"``, ``"512M"`` or ``"1.5GiB"`` into bytes."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a size, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{key}: size must not be negative, got {value}")
        return value
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            unit = (m.group(2) or "").upper()[:1]
            return int(float(m.group(1)) * _UNITS[unit])
    raise ConfigError(f"{key}: expected a size such as 4194304 or \"4MiB\", got {value!r}")


def default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/ckptfs")
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "ckptfs"


@dataclass(frozen=True)
class TierConfig:
    """A local tier: a directory standing for one device."""

    name: str
    kind: str  # always "local"; remote tiers are S3TierConfig
    path: Path
    location: str = "local"
    weight: float = 1.0
    capacity: int | None = None  # optional cap in bytes; None means the device's free space
    # A missing directory is refused (an unmounted device would fill the disk below it)
    # unless ``create``; two tiers on one device are refused unless both allow it.
    create: bool = False
    allow_shared_device: bool = False
    # Large frames written with O_DIRECT from reused buffers where the filesystem takes it
    # (tiers/direct.py); "device" also reads every frame back from the device to check it.
    direct_io: bool = True
    verify_writes: str = "memory"  # "memory" | "device"
    # Where the tier came from, for error messages: "tier[2]", "--local", "recorded", "default".
    origin: str = field(default="", compare=False)


ADDRESSING_STYLES = ("path", "virtual", "auto")


@dataclass(frozen=True)
class S3TierConfig:
    """A remote tier in an S3 bucket. Objects live at ``<prefix>/chunks/<digest>``.

    Credentials come from the standard AWS chain (environment, shared config and
    credentials files, ``profile``), never from this file.
    """

    name: str
    bucket: str
    prefix: str = ""  # no leading or trailing "/"; "" means the bucket root
    endpoint_url: str | None = None  # None: the AWS endpoint for ``region``
    region: str = "us-east-1"
    addressing_style: str = "path"  # "path" | "virtual" | "auto"
    verify_tls: bool = True
    profile: str | None = None
    location: str = "remote"
    weight: float = 1.0
    kind: str = field(default="s3", init=False)


@dataclass(frozen=True)
class DurabilityPolicy:
    """Files under ``path`` (absolute inside the mount) commit with this durability:
    "local" (close/fsync return once the local tiers hold the data) or "remote" (they also
    wait, up to ``timeout_s``, until the remote tiers hold it and it is recoverable)."""

    path: str
    durability: str
    timeout_s: float = 600.0

    def covers(self, path: str) -> bool:
        return self.path == "/" or path == self.path or path.startswith(self.path + "/")


def policy_for(policies: tuple[DurabilityPolicy, ...], path: str) -> DurabilityPolicy | None:
    """The policy with the longest path that covers ``path`` (None: the default, local)."""
    best = None
    for p in policies:
        if p.covers(path) and (best is None or len(p.path) > len(best.path)):
            best = p
    return best


@dataclass(frozen=True)
class Config:
    state_dir: Path
    tiers: tuple[TierConfig, ...]  # local tiers: new chunks land here
    chunk_size: int = DEFAULT_CHUNK_SIZE
    memory_budget: int = DEFAULT_MEMORY_BUDGET
    io_threads: int = DEFAULT_IO_THREADS
    allow_other: bool = False  # config_from_dict: on by default when running as root
    # The kernel checks permissions from the mode bits (FUSE default_permissions); off
    # only for a single-user mount, since ckptfs itself checks no access.
    default_permissions: bool = True
    remote_tiers: tuple[S3TierConfig, ...] = ()  # remote tiers: the uploader copies chunks here
    remote_copies: int = 1  # how many remote tiers hold each chunk
    upload_concurrency: int = 8  # uploads in flight at once
    upload_during_save: str = "auto"  # one of UPLOAD_DURING_SAVE (upload/uploader.py)
    remote_compression: str = "auto"  # one of REMOTE_COMPRESSION_MODES
    # Reads: bytes fetched ahead of each sequential reader (0: none), and when a chunk read
    # from a remote tier only is written to a local tier too.
    readahead: int = DEFAULT_READAHEAD
    copy_back: str = "sequential"
    # Checkpoint awareness (checkpoints.md): detection, partial timeout, retention.
    checkpoints: bool = True
    checkpoint_partial_after_s: float = 600.0
    checkpoint_patterns: tuple[Any, ...] = ()  # PatternConfig (checkpoints/detectors.py)
    retention: tuple[Any, ...] = ()  # RetentionPolicy (checkpoints/retention.py)
    local_high_watermark: float = 0.9
    # When the local tiers are full of chunks not yet on a remote: wait for uploads to
    # free room (backpressure, at most local_full_timeout_s) or fail at once with ENOSPC.
    on_local_full: str = "block"
    local_full_timeout_s: float = 600.0
    policies: tuple[DurabilityPolicy, ...] = ()  # per-directory durability
    # Prometheus metrics: "HOST:PORT" to listen on ("" disables; port 0 picks a free one).
    metrics_address: str = DEFAULT_METRICS_ADDRESS
    source: str = field(default="<embedded default>", compare=False)

    @property
    def catalog_path(self) -> Path:
        return self.state_dir / CATALOG_FILE

    @property
    def log_path(self) -> Path:
        return self.state_dir / "ckptfs.log"


_TOP_KEYS = {
    "state_dir", "chunk_size", "memory_budget", "io_threads", "allow_other",
    "default_permissions", "tier",
    "remote_copies", "upload_concurrency", "upload_during_save", "on_local_full",
    "local_full_timeout", "policy",
    "remote_compression", "readahead", "copy_back", "checkpoints", "checkpoint_partial_after",
    "checkpoint_pattern", "retention", "local_high_watermark", "metrics_address",
}
_POLICY_KEYS = {"path", "durability", "timeout"}
_DURABILITIES = ("local", "remote")
_ON_LOCAL_FULL = ("block", "enospc")
UPLOAD_DURING_SAVE = ("auto", "defer", "overlap")
_COMMON_TIER_KEYS = {"name", "kind", "location", "weight"}
_LOCAL_ONLY_KEYS = {
    "path", "capacity", "create", "allow_shared_device", "direct_io", "verify_writes",
}
_VERIFY_WRITES = ("memory", "device")
_S3_ONLY_KEYS = {
    "bucket", "prefix", "endpoint_url", "region", "addressing_style", "verify_tls", "profile",
}
_TIER_KEYS = _COMMON_TIER_KEYS | _LOCAL_ONLY_KEYS | _S3_ONLY_KEYS
_TIER_KINDS = ("local", "s3")

# AWS bucket naming rules (S3-compatible servers follow them too): 3-63 of [a-z0-9.-],
# starting and ending with a letter or digit.
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_REGION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_PREFIX_BAD_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")


def _take_str(table: dict[str, Any], key: str, where: str) -> str:
    value = table[key]
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _take_weight(table: dict[str, Any], key: str) -> float:
    weight = table.get("weight", 1.0)
    if (
        isinstance(weight, bool)
        or not isinstance(weight, int | float)
        or not math.isfinite(weight)
        or weight <= 0
    ):
        raise ConfigError(f"{key}: expected a positive number, got {weight!r}")
    return float(weight)


def _tier_from_table(table: object, index: int) -> TierConfig | S3TierConfig:
    where = f"tier[{index}]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table ([[tier]])")
    for key in table:
        if key not in _TIER_KEYS:
            raise ConfigError(f"{where}.{key}: unknown key (allowed: {', '.join(sorted(_TIER_KEYS))})")
    for key in ("name", "kind"):
        if key not in table:
            raise ConfigError(f"{where}.{key}: missing required key")
    name = _take_str(table, "name", f"{where}.name")
    if not _NAME_RE.match(name):
        raise ConfigError(f"{where}.name: {name!r} must be 1-64 of [A-Za-z0-9_.-]")
    kind = _take_str(table, "kind", f"{where}.kind")
    if kind not in _TIER_KINDS:
        raise ConfigError(
            f"{where}.kind: unsupported tier kind {kind!r} (supported: {', '.join(_TIER_KINDS)})"
        )
    own, other = (_LOCAL_ONLY_KEYS, _S3_ONLY_KEYS) if kind == "local" else (_S3_ONLY_KEYS, _LOCAL_ONLY_KEYS)
    for key in table:
        if key in other:
            raise ConfigError(
                f"{where}.{key}: not allowed for a tier of kind {kind!r} "
                f"(allowed: {', '.join(sorted(_COMMON_TIER_KEYS | own))})"
            )
    if kind == "s3":
        return _s3_tier_from_table(table, name, where)
    if "path" not in table:
        raise ConfigError(f"{where}.path: missing required key")
    path = Path(_take_str(table, "path", f"{where}.path"))
    if not path.is_absolute():
        raise ConfigError(f"{where}.path: must be an absolute path, got {str(path)!r}")
    location = _take_str(table, "location", f"{where}.location") if "location" in table else "local"
    weight = _take_weight(table, f"{where}.weight")
    capacity = None
    if "capacity" in table:
        capacity = parse_size(table["capacity"], f"{where}.capacity")
        if capacity <= 0:
            raise ConfigError(f"{where}.capacity: must be positive")
    flags = {}
    for key in ("create", "allow_shared_device", "direct_io"):
        value = table.get(key, key == "direct_io")
        if not isinstance(value, bool):
            raise ConfigError(f"{where}.{key}: expected true or false, got {value!r}")
        flags[key] = value
    verify_writes = table.get("verify_writes", "memory")
    if verify_writes not in _VERIFY_WRITES:
        raise ConfigError(
            f"{where}.verify_writes: expected one of {', '.join(_VERIFY_WRITES)}, got {verify_writes!r}"
        )
    return TierConfig(name, kind, path, location, weight, capacity, origin=where,
                      verify_writes=verify_writes, **flags)


def _s3_tier_from_table(table: dict[str, Any], name: str, where: str) -> S3TierConfig:
    """Validate the keys of an s3 tier. ``where`` prefixes every error (``tier[2]``); with
    ``where=""`` errors start with the bare key (``bucket: ...``)."""

    def key(k: str) -> str:
        return f"{where}.{k}" if where else k

    if "bucket" not in table:
        raise ConfigError(f"{key('bucket')}: missing required key")
    bucket = _take_str(table, "bucket", key("bucket"))
    if not _BUCKET_RE.match(bucket) or ".." in bucket:
        raise ConfigError(
            f"{key('bucket')}: {bucket!r} is not a valid bucket name "
            "(3-63 of lowercase letters, digits, '.' and '-', starting and ending with a "
            "letter or digit)"
        )
    prefix = ""
    if "prefix" in table:
        raw = table["prefix"]
        if not isinstance(raw, str):
            raise ConfigError(f"{key('prefix')}: expected a string, got {raw!r}")
        prefix = raw.rstrip("/")
        if prefix:
            if prefix.startswith("/"):
                raise ConfigError(f"{key('prefix')}: must not start with '/', got {raw!r}")
            if _PREFIX_BAD_CHARS.search(prefix):
                raise ConfigError(
                    f"{key('prefix')}: control characters and '\\' are not allowed, got {raw!r}"
                )
            if any(seg in ("", ".", "..") for seg in prefix.split("/")):
                raise ConfigError(
                    f"{key('prefix')}: empty, '.' or '..' path segments are not allowed, got {raw!r}"
                )
            if len(prefix.encode()) > 512:
                raise ConfigError(f"{key('prefix')}: longer than 512 bytes")
    endpoint_url = None
    if "endpoint_url" in table:
        endpoint_url = _take_str(table, "endpoint_url", key("endpoint_url"))
        _check_endpoint_url(endpoint_url, key("endpoint_url"))
    region = "us-east-1"
    if "region" in table:
        region = _take_str(table, "region", key("region"))
        if not _REGION_RE.match(region):
            raise ConfigError(f"{key('region')}: {region!r} is not a region name")
    addressing_style = "path"
    if "addressing_style" in table:
        addressing_style = _take_str(table, "addressing_style", key("addressing_style"))
        if addressing_style not in ADDRESSING_STYLES:
            raise ConfigError(
                f"{key('addressing_style')}: expected one of {', '.join(ADDRESSING_STYLES)}, "
                f"got {addressing_style!r}"
            )
    verify_tls = table.get("verify_tls", True)
    if not isinstance(verify_tls, bool):
        raise ConfigError(f"{key('verify_tls')}: expected true or false, got {verify_tls!r}")
    profile = _take_str(table, "profile", key("profile")) if "profile" in table else None
    location = _take_str(table, "location", key("location")) if "location" in table else "remote"
    weight = _take_weight(table, key("weight"))
    return S3TierConfig(
        name=name,
        bucket=bucket,
        prefix=prefix,
        endpoint_url=endpoint_url,
        region=region,
        addressing_style=addressing_style,
        verify_tls=verify_tls,
        profile=profile,
        location=location,
        weight=weight,
    )


def _check_endpoint_url(url: str, where: str) -> None:
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # raises ValueError on a bad port
    except ValueError as exc:
        raise ConfigError(f"{where}: {url!r} is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where}: expected http://HOST[:PORT] or https://HOST[:PORT], got {url!r}")
    if parts.username is not None or parts.password is not None:
        raise ConfigError(
            f"{where}: credentials do not belong in the endpoint URL; use the AWS credential "
            "chain (environment, shared credentials file, profile)"
        )
    if port == 0:
        raise ConfigError(f"{where}: port 0 is not a port, got {url!r}")
    if parts.query or parts.fragment:
        raise ConfigError(f"{where}: no query or fragment allowed, got {url!r}")


# The query parameters of a --remote URL and the tier keys they set.
_REMOTE_URL_PARAMS = {
    "endpoint": "endpoint_url",
    "region": "region",
    "addressing": "addressing_style",
    "verify_tls": "verify_tls",
    "profile": "profile",
    "location": "location",
    "weight": "weight",
}
_BOOL_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def parse_remote_url(url: str, name: str = "remote0") -> S3TierConfig:
    """An s3 tier from ``s3://BUCKET[/PREFIX][?endpoint=URL&region=R&addressing=path|virtual|auto
    &verify_tls=true|false&profile=P&location=L&weight=W]``. Errors start with ``--remote``."""
    where = f"--remote {url!r}"
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as exc:
        raise ConfigError(f"{where}: not a URL ({exc})") from None
    if parts.scheme != "s3":
        raise ConfigError(f"{where}: expected s3://BUCKET/PREFIX?endpoint=URL")
    if "@" in parts.netloc:
        raise ConfigError(
            f"{where}: credentials do not belong in the URL; use the AWS credential chain "
            "(environment, shared credentials file, profile)"
        )
    if not parts.netloc:
        raise ConfigError(f"{where}: missing bucket name (s3://BUCKET/PREFIX)")
    if parts.fragment:
        raise ConfigError(f"{where}: unexpected fragment #{parts.fragment}")
    table: dict[str, Any] = {"bucket": parts.netloc}
    prefix = urllib.parse.unquote(parts.path.lstrip("/"))
    if prefix:
        table["prefix"] = prefix
    try:
        params = urllib.parse.parse_qsl(parts.query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        if parts.query:
            raise ConfigError(f"{where}: malformed query {parts.query!r} (expected k=v&k=v)") from None
        params = []
    for param, value in params:
        tier_key = _REMOTE_URL_PARAMS.get(param)
        if tier_key is None:
            raise ConfigError(
                f"{where}: unknown parameter {param!r} (allowed: {', '.join(_REMOTE_URL_PARAMS)})"
            )
        if tier_key in table:
            raise ConfigError(f"{where}: parameter {param!r} given twice")
        parsed: object = value
        if tier_key == "verify_tls":
            parsed = _BOOL_WORDS.get(value.lower(), value)
        elif tier_key == "weight":
            try:
                parsed = float(value)
            except ValueError:
                parsed = value
        table[tier_key] = parsed
    try:
        return _s3_tier_from_table(table, name, "")
    except ConfigError as exc:
        msg = str(exc)  # "region: ..." -> "--remote 's3://...': region: ..."
        for param, tier_key in _REMOTE_URL_PARAMS.items():
            if msg.startswith(tier_key + ":") and param != tier_key:
                msg = f"{param} ({tier_key}){msg[len(tier_key):]}"
                break
        raise ConfigError(f"{where}: {msg}") from None


def local_tiers_from_paths(paths: list[str]) -> tuple[TierConfig, ...]:
    tiers = []
    for i, p in enumerate(paths):
        path = Path(p).expanduser().absolute()
        tiers.append(TierConfig(name=f"local{i}", kind="local", path=path, origin="--local"))
    return tuple(tiers)


def _int_key(data: dict[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"{key}: expected an integer from {lo} to {hi}, got {value!r}")
    return value


def _seconds(value: object, key: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise ConfigError(f"{key}: expected a number of seconds from {lo:g} to {hi:g}, got {value!r}")
    return float(value)


def _choice(value: object, key: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(f"{key}: expected one of {', '.join(map(repr, choices))}, got {value!r}")
    assert isinstance(value, str)
    return value


def array_of_tables(
    raw: object, name: str, allowed: set[str], required: tuple[str, ...] = ()
) -> list[tuple[str, dict[str, Any]]]:
    """Check a ``[[name]]`` array of tables: each item a table with only ``allowed`` keys
    and every ``required`` one. Returns (where, table) pairs; "where" names the item in
    error messages (``name[i]``)."""
    if not isinstance(raw, list):
        raise ConfigError(f"{name}: expected an array of tables ([[{name}]])")
    out = []
    for i, table in enumerate(raw):
        where = f"{name}[{i}]"
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: expected a table")
        for key in table:
            if key not in allowed:
                raise ConfigError(
                    f"{where}.{key}: unknown key (allowed: {', '.join(sorted(allowed))})"
                )
        for key in required:
            if key not in table:
                raise ConfigError(f"{where}.{key}: missing required key")
        out.append((where, table))
    return out


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
            _choice(table["durability"], f"{where}.durability", _DURABILITIES),
            _seconds(table.get("timeout", 600), f"{where}.timeout", 0.001, 7 * 86400),
        ))
    return tuple(out)


def parse_metrics_address(value: object, key: str = "metrics_address") -> str:
    """``"HOST:PORT"`` (``"[::1]:PORT"`` for IPv6; port 0 picks a free one) or ``""``
    (no metrics). Returned normalized; raises ConfigError naming ``key``."""
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected a string such as \"127.0.0.1:9464\", got {value!r}")
    if value == "":
        return ""
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if ":" not in host:
            raise ConfigError(f"{key}: brackets are for IPv6 addresses, got {value!r}")
    elif ":" in host:
        raise ConfigError(f"{key}: write an IPv6 address in brackets, e.g. \"[::1]:9464\", got {value!r}")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(
            f"{key}: expected HOST:PORT with a port from 0 to 65535 (or \"\" for no metrics), "
            f"got {value!r}"
        )
    if any(ch.isspace() or ch in "/[]@" for ch in host):
        raise ConfigError(f"{key}: {host!r} is not a host name or address")
    return f"[{host}]:{int(port)}" if ":" in host else f"{host}:{int(port)}"


def config_from_dict(data: dict[str, Any], source: str = "<dict>") -> Config:
    for key in data:
        if key not in _TOP_KEYS:
            raise ConfigError(f"{key}: unknown key (allowed: {', '.join(sorted(_TOP_KEYS))})")
    state_dir = default_state_dir()
    if "state_dir" in data:
        state_dir = Path(_take_str(data, "state_dir", "state_dir"))
        if not state_dir.is_absolute():
            raise ConfigError(f"state_dir: must be an absolute path, got {str(state_dir)!r}")
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
    io_threads = _int_key(data, "io_threads", DEFAULT_IO_THREADS, 1, 256)
    remote_copies = _int_key(data, "remote_copies", 1, 1, 16)
    upload_concurrency = _int_key(data, "upload_concurrency", 8, 1, 256)
    upload_during_save = data.get("upload_during_save", "auto")
    if upload_during_save not in UPLOAD_DURING_SAVE:
        raise ConfigError(
            f"upload_during_save: expected one of {', '.join(UPLOAD_DURING_SAVE)}, "
            f"got {upload_during_save!r}"
        )
    remote_compression = data.get("remote_compression", "auto")
    if remote_compression not in REMOTE_COMPRESSION_MODES:
        raise ConfigError(
            f"remote_compression: expected one of {', '.join(REMOTE_COMPRESSION_MODES)}, "
            f"got {remote_compression!r}"
        )
    readahead = parse_size(data.get("readahead", DEFAULT_READAHEAD), "readahead")
    if readahead > 4 * GiB:
        raise ConfigError(f"readahead: {readahead} is more than 4 GiB")
    copy_back = _choice(data.get("copy_back", "sequential"), "copy_back",
                        ("sequential", "always", "never"))
    checkpoints = data.get("checkpoints", True)
    if not isinstance(checkpoints, bool):
        raise ConfigError(f"checkpoints: expected true or false, got {checkpoints!r}")
    partial_after = _seconds(
        data.get("checkpoint_partial_after", 600), "checkpoint_partial_after", 0.001, 7 * 86400
    )
    hwm = data.get("local_high_watermark", 0.9)
    if isinstance(hwm, bool) or not isinstance(hwm, int | float) or not 0.5 <= hwm <= 0.99:
        raise ConfigError(f"local_high_watermark: expected a fraction from 0.5 to 0.99, got {hwm!r}")
    from .checkpoints.retention import policies_from_config

    retention = policies_from_config(data.get("retention", []))
    patterns: tuple[Any, ...] = ()
    if "checkpoint_pattern" in data:
        from .checkpoints.detectors import patterns_from_config

        patterns = tuple(patterns_from_config(data["checkpoint_pattern"]))
    on_local_full = _choice(data.get("on_local_full", "block"), "on_local_full", _ON_LOCAL_FULL)
    local_full_timeout_s = _seconds(
        data.get("local_full_timeout", 600), "local_full_timeout", 0.001, 7 * 86400
    )
    policies = _policies_from(data.get("policy", []))
    metrics_address = parse_metrics_address(data.get("metrics_address", DEFAULT_METRICS_ADDRESS))
    # A root daemon serves the users training jobs run as (like JuiceFS): allow_other.
    allow_other = data.get("allow_other", os.geteuid() == 0)
    if not isinstance(allow_other, bool):
        raise ConfigError(f"allow_other: expected true or false, got {allow_other!r}")
    default_permissions = data.get("default_permissions", True)
    if not isinstance(default_permissions, bool):
        raise ConfigError(
            f"default_permissions: expected true or false, got {default_permissions!r}")
    raw_tiers = data.get("tier", [])
    if not isinstance(raw_tiers, list):
        raise ConfigError("tier: expected an array of tables ([[tier]])")
    all_tiers = [_tier_from_table(t, i) for i, t in enumerate(raw_tiers)]
    names = [t.name for t in all_tiers]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ConfigError(f"tier[{i}].name: duplicate tier name {name!r}")
    tiers = tuple(t for t in all_tiers if isinstance(t, TierConfig))
    remote_tiers = tuple(t for t in all_tiers if isinstance(t, S3TierConfig))
    return Config(
        state_dir=state_dir,
        tiers=tiers,
        remote_tiers=remote_tiers,
        chunk_size=chunk_size,
        memory_budget=memory_budget,
        io_threads=io_threads,
        allow_other=allow_other,
        default_permissions=default_permissions,
        remote_copies=remote_copies,
        upload_concurrency=upload_concurrency,
        upload_during_save=upload_during_save,
        remote_compression=remote_compression,
        readahead=readahead,
        copy_back=copy_back,
        checkpoints=checkpoints,
        checkpoint_partial_after_s=partial_after,
        checkpoint_patterns=patterns,
        retention=retention,
        local_high_watermark=float(hwm),
        on_local_full=on_local_full,
        local_full_timeout_s=local_full_timeout_s,
        policies=policies,
        metrics_address=metrics_address,
        source=source,
    )


def recorded_tiers(state_dir: Path) -> tuple[tuple[TierConfig, ...], tuple[S3TierConfig, ...]]:
    """The local and remote tiers an existing catalog was last mounted with (read-only)."""
    records = read_recorded_tiers(state_dir / CATALOG_FILE)
    if records is None:
        return (), ()
    local = tuple(
        TierConfig(name=t["name"], kind=t["kind"], path=Path(t["path"]), location=t["location"],
                   allow_shared_device=t.get("allow_shared_device") is True,
                   direct_io=t.get("direct_io") is not False,
                   verify_writes="device" if t.get("verify_writes") == "device" else "memory",
                   origin="recorded")
        for t in records if t.get("kind", "local") == "local"
    )
    remote = tuple(
        S3TierConfig(
            name=t["name"], bucket=t["bucket"], prefix=t.get("prefix", ""),
            endpoint_url=t.get("endpoint_url"), region=t.get("region", "us-east-1"),
            addressing_style=t.get("addressing_style", "path"), location=t.get("location", "remote"),
        )
        for t in records if t.get("kind") == "s3"
    )
    return local, remote


def load_config(
    path: str | Path | None = None,
    *,
    state_dir: str | Path | None = None,
    local_dirs: list[str] | None = None,
    chunk_size: str | int | None = None,
    remote_urls: list[str] | None = None,
    create_tiers: bool = False,
    allow_shared_device: bool = False,
) -> Config:
    """Build the effective config: file (if any), then command-line overrides, then defaults.

    With no file and no ``--local``, the tiers recorded in an existing catalog apply (so a
    remount needs only ``--state-dir``); for a new state dir, the embedded default: one
    local tier under the state directory. Remote tiers (``[[tier]]`` of kind "s3", and
    ``--remote`` URLs, named remote0, remote1, ... after the file's tiers) never replace
    the local ones. ``create_tiers`` / ``allow_shared_device`` (``--create``,
    ``--allow-shared-device``) set ``create`` / ``allow_shared_device`` on every local tier.
    """
    data: dict[str, Any] = {}
    source = "<embedded default>"
    if path is not None:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"--config: no such file: {path}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        except OSError as exc:
            raise ConfigError(f"--config: cannot read {path}: {exc.strerror}") from None
        source = str(path)
    if state_dir is not None:
        data["state_dir"] = str(Path(state_dir).expanduser().absolute())
    if chunk_size is not None:
        data["chunk_size"] = chunk_size
    cfg = config_from_dict(data, source)
    tiers = cfg.tiers
    if local_dirs:
        extra = local_tiers_from_paths(local_dirs)
        taken = {t.name for t in tiers} | {t.name for t in cfg.remote_tiers}
        renamed = []
        for i, t in enumerate(extra):
            name = t.name
            n = i
            while name in taken:
                n += 1
                name = f"local{n}"
            taken.add(name)
            renamed.append(dataclasses.replace(t, name=name))
        tiers = tiers + tuple(renamed)
    remote_tiers = cfg.remote_tiers
    if not tiers and not remote_tiers and not remote_urls:
        # A remount with only --state-dir: the tiers the catalog was last mounted with.
        tiers, remote_tiers = recorded_tiers(cfg.state_dir)
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
    paths = [t.path for t in tiers]
    for i, p in enumerate(paths):
        if p in paths[:i]:
            raise ConfigError(f"tier[{i}].path: {p} is used by two tiers")
    if remote_urls:
        taken = {t.name for t in tiers} | {t.name for t in remote_tiers}
        added = []
        n = 0
        for url in remote_urls:
            while f"remote{n}" in taken:
                n += 1
            name = f"remote{n}"
            taken.add(name)
            added.append(parse_remote_url(url, name))
        remote_tiers = remote_tiers + tuple(added)
    # Everything else as the file (and the flags above) set it.
    return dataclasses.replace(cfg, tiers=tiers, remote_tiers=remote_tiers, source=source)
