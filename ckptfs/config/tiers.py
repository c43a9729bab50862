"""The tiers of a config: ``[[tier]]`` tables (kind "local" or "s3"), ``--remote`` URLs and
``--local`` directories, checked into TierConfig / S3TierConfig."""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .model import ADDRESSING_STYLES, VERIFY_WRITES, AddressingStyle, S3TierConfig, TierConfig
from .parse import choice, parse_size, take_bool, take_str, take_weight

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_COMMON_TIER_KEYS = {"name", "kind", "location", "weight"}
_LOCAL_ONLY_KEYS = {
    "path", "capacity", "create", "allow_shared_device", "direct_io", "verify_writes",
}
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


def tier_from_table(table: object, index: int) -> TierConfig | S3TierConfig:
    where = f"tier[{index}]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table ([[tier]])")
    for key in table:
        if key not in _TIER_KEYS:
            raise ConfigError(f"{where}.{key}: unknown key (allowed: {', '.join(sorted(_TIER_KEYS))})")
    for key in ("name", "kind"):
        if key not in table:
            raise ConfigError(f"{where}.{key}: missing required key")
    name = take_str(table, "name", f"{where}.name")
    if not _NAME_RE.match(name):
        raise ConfigError(f"{where}.name: {name!r} must be 1-64 of [A-Za-z0-9_.-]")
    kind = take_str(table, "kind", f"{where}.kind")
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
        return s3_tier_from_table(table, name, where)
    if "path" not in table:
        raise ConfigError(f"{where}.path: missing required key")
    path = Path(take_str(table, "path", f"{where}.path"))
    if not path.is_absolute():
        raise ConfigError(f"{where}.path: must be an absolute path, got {str(path)!r}")
    location = take_str(table, "location", f"{where}.location") if "location" in table else "local"
    weight = take_weight(table, f"{where}.weight")
    capacity = None
    if "capacity" in table:
        capacity = parse_size(table["capacity"], f"{where}.capacity")
        if capacity <= 0:
            raise ConfigError(f"{where}.capacity: must be positive")
    flags = {
        key: take_bool(table.get(key, key == "direct_io"), f"{where}.{key}")
        for key in ("create", "allow_shared_device", "direct_io")
    }
    verify_writes = choice(table.get("verify_writes", "memory"), f"{where}.verify_writes",
                           VERIFY_WRITES, quoted=False)
    return TierConfig(name, kind, path, location, weight, capacity, origin=where,
                      verify_writes=verify_writes, **flags)


def s3_tier_from_table(table: dict[str, Any], name: str, where: str) -> S3TierConfig:
    """Validate the keys of an s3 tier. ``where`` prefixes every error (``tier[2]``); with
    ``where=""`` errors start with the bare key (``bucket: ...``)."""

    def key(k: str) -> str:
        return f"{where}.{k}" if where else k

    bucket = _bucket_of(table, key("bucket"))
    prefix = _prefix_of(table, key("prefix"))
    endpoint_url = None
    if "endpoint_url" in table:
        endpoint_url = take_str(table, "endpoint_url", key("endpoint_url"))
        _check_endpoint_url(endpoint_url, key("endpoint_url"))
    region = "us-east-1"
    if "region" in table:
        region = take_str(table, "region", key("region"))
        if not _REGION_RE.match(region):
            raise ConfigError(f"{key('region')}: {region!r} is not a region name")
    addressing_style: AddressingStyle = "path"
    if "addressing_style" in table:
        addressing_style = choice(
            take_str(table, "addressing_style", key("addressing_style")),
            key("addressing_style"), ADDRESSING_STYLES, quoted=False,
        )
    verify_tls = take_bool(table.get("verify_tls", True), key("verify_tls"))
    profile = take_str(table, "profile", key("profile")) if "profile" in table else None
    location = take_str(table, "location", key("location")) if "location" in table else "remote"
    weight = take_weight(table, key("weight"))
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


def _bucket_of(table: dict[str, Any], where: str) -> str:
    if "bucket" not in table:
        raise ConfigError(f"{where}: missing required key")
    bucket = take_str(table, "bucket", where)
    if not _BUCKET_RE.match(bucket) or ".." in bucket:
        raise ConfigError(
            f"{where}: {bucket!r} is not a valid bucket name "
            "(3-63 of lowercase letters, digits, '.' and '-', starting and ending with a "
            "letter or digit)"
        )
    return bucket


def _prefix_of(table: dict[str, Any], where: str) -> str:
    """The key prefix, without its trailing '/' ("" for the bucket's root)."""
    prefix = ""
    if "prefix" in table:
        raw = table["prefix"]
        if not isinstance(raw, str):
            raise ConfigError(f"{where}: expected a string, got {raw!r}")
        prefix = raw.rstrip("/")
        if prefix:
            if prefix.startswith("/"):
                raise ConfigError(f"{where}: must not start with '/', got {raw!r}")
            if _PREFIX_BAD_CHARS.search(prefix):
                raise ConfigError(
                    f"{where}: control characters and '\\' are not allowed, got {raw!r}"
                )
            if any(seg in ("", ".", "..") for seg in prefix.split("/")):
                raise ConfigError(
                    f"{where}: empty, '.' or '..' path segments are not allowed, got {raw!r}"
                )
            if len(prefix.encode()) > 512:
                raise ConfigError(f"{where}: longer than 512 bytes")
    return prefix


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
        return s3_tier_from_table(table, name, "")
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

