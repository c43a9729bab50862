"""The governance tables of a config (docs/governance.md): ``[[namespace]]``, ``[access]``,
``[keys]`` and ``[audit]``, checked into GovernanceConfig, and the checks that need the
whole config (residency against the tiers, retention classes, key paths against the state
dir). Every error names its key."""

from __future__ import annotations

import dataclasses
import datetime
import re
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .model import (
    DEFAULT_REFUSAL_WINDOW_S,
    DEFAULT_SEAL_INTERVAL_S,
    AuditConfig,
    Config,
    GovernanceConfig,
    KeysConfig,
    NamespaceConfig,
    RetentionPolicy,
)
from .nsroot import ROOT_KEYS, root_of
from .parse import array_of_tables, parse_size, seconds, section, take_bool

NAMESPACE_KEYS = {"path", "uids", "gids", "allowed_locations", "encrypt", "quota", "retention",
                  "expires", *ROOT_KEYS}
_KEYS_KEYS = {"kek_file", "kek_command"}
_AUDIT_KEYS = {"signing_key_file", "seal_interval", "refusal_window"}
_ACCESS_KEYS = {"admin_gids"}
_LOCATION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
_MAX_ID = 2**32 - 2  # (uid_t)-1 means "no id"


def _ids(value: object, key: str) -> tuple[int, ...]:
    if not isinstance(value, list) or any(
        isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _MAX_ID for v in value
    ):
        raise ConfigError(f"{key}: expected a list of numeric ids (0 to {_MAX_ID}), got {value!r}")
    return tuple(sorted(set(value)))


def _abs_file(value: object, key: str) -> Path:
    if not isinstance(value, str) or not value.startswith("/") or "\x00" in value:
        raise ConfigError(f"{key}: expected an absolute path, got {value!r}")
    return Path(value)


def _namespace_path(value: object, key: str) -> str:
    if not isinstance(value, str) or not value.startswith("/") or "\x00" in value:
        raise ConfigError(f"{key}: expected a directory inside the mount starting with '/', "
                          f"got {value!r}")
    parts = [p for p in value.split("/") if p]
    if not parts:
        raise ConfigError(f"{key}: the mount root cannot be a namespace (paths outside every "
                          f"namespace are the default namespace)")
    if any(p in (".", "..") for p in parts):
        raise ConfigError(f"{key}: '.' and '..' are not allowed, got {value!r}")
    return "/" + "/".join(parts)


def _instant(value: object, key: str) -> int:
    """A TOML offset date-time, or an ISO 8601 string with its offset, as ns since the epoch."""
    if isinstance(value, str):
        try:
            value = datetime.datetime.fromisoformat(value)
        except ValueError:
            raise ConfigError(f"{key}: expected a date and time with its offset, e.g. "
                              f"2027-06-30T00:00:00Z, got {value!r}") from None
    if not isinstance(value, datetime.datetime) or value.tzinfo is None:
        raise ConfigError(f"{key}: expected a date and time with its offset, e.g. "
                          f"2027-06-30T00:00:00Z, got {value!r}")
    return round(value.timestamp() * 1e6) * 1000


def namespaces_from_config(raw: object) -> tuple[NamespaceConfig, ...]:
    out: list[NamespaceConfig] = []
    for where, table in array_of_tables(raw, "namespace", NAMESPACE_KEYS, ("path",)):
        path = _namespace_path(table["path"], f"{where}.path")
        for other in out:
            if other.covers(path) or path.startswith(other.path + "/") or (
                other.path.startswith(path + "/")
            ):
                raise ConfigError(
                    f"{where}.path: {path!r} overlaps {other.origin}.path {other.path!r} "
                    f"(namespaces do not nest)"
                )
        uids = _ids(table.get("uids", []), f"{where}.uids")
        gids = _ids(table.get("gids", []), f"{where}.gids")
        if not uids and not gids:
            raise ConfigError(f"{where}.uids: a namespace needs owners (uids and/or gids)")
        locations = None
        if "allowed_locations" in table:
            raw_loc = table["allowed_locations"]
            if not isinstance(raw_loc, list) or not raw_loc or any(
                not isinstance(v, str) or not _LOCATION_RE.match(v) for v in raw_loc
            ):
                raise ConfigError(
                    f"{where}.allowed_locations: expected a non-empty list of location labels "
                    f"(1-64 of [A-Za-z0-9_.:-]), got {raw_loc!r}"
                )
            locations = tuple(dict.fromkeys(raw_loc))
        quota = None
        if "quota" in table:
            quota = parse_size(table["quota"], f"{where}.quota")
            if quota <= 0:
                raise ConfigError(f"{where}.quota: must be positive")
        retention = table.get("retention")
        if retention is not None and (not isinstance(retention, str) or not retention):
            raise ConfigError(f"{where}.retention: expected the name of a [[retention]] table, "
                              f"got {retention!r}")
        encrypt = take_bool(table.get("encrypt", False), f"{where}.encrypt")
        expires_ns = None
        if "expires" in table:
            expires_ns = _instant(table["expires"], f"{where}.expires")
            if not encrypt:
                raise ConfigError(f"{where}.expires: only an encrypted namespace expires (its "
                                  f"keys are shredded); set encrypt = true")
        root_uid, root_gid, root_mode = root_of(table, where, uids, gids)
        out.append(NamespaceConfig(
            path=path, uids=uids, gids=gids, allowed_locations=locations,
            encrypt=encrypt, quota=quota, retention=retention, expires_ns=expires_ns,
            origin=where, root_uid=root_uid, root_gid=root_gid, root_mode=root_mode,
        ))
    return tuple(out)


def governance_from_config(data: dict[str, Any]) -> GovernanceConfig:
    """The ``namespace``, ``access``, ``keys`` and ``audit`` keys of a config file."""
    namespaces = namespaces_from_config(data.get("namespace", []))
    access = section(data, "access", _ACCESS_KEYS)
    keys = section(data, "keys", _KEYS_KEYS)
    if "kek_file" in keys and "kek_command" in keys:
        raise ConfigError("keys.kek_command: give kek_file or kek_command, not both")
    kek_command = keys.get("kek_command")
    if kek_command is not None and (not isinstance(kek_command, str) or not kek_command.strip()):
        raise ConfigError(f"keys.kek_command: expected a command line, got {kek_command!r}")
    keys_cfg = KeysConfig(
        kek_file=_abs_file(keys["kek_file"], "keys.kek_file") if "kek_file" in keys else None,
        kek_command=kek_command,
    )
    for ns in namespaces:
        if ns.encrypt and not keys_cfg.configured:
            raise ConfigError(
                f"{ns.origin}.encrypt: an encrypted namespace needs a key-encryption key "
                f"([keys] kek_file or kek_command)"
            )
    audit = section(data, "audit", _AUDIT_KEYS)
    audit_cfg = AuditConfig(
        signing_key_file=(_abs_file(audit["signing_key_file"], "audit.signing_key_file")
                          if "signing_key_file" in audit else None),
        seal_interval_s=seconds(audit.get("seal_interval", DEFAULT_SEAL_INTERVAL_S),
                                "audit.seal_interval", 1, 30 * 86400),
        refusal_window_s=seconds(audit.get("refusal_window", DEFAULT_REFUSAL_WINDOW_S),
                                 "audit.refusal_window", 0.1, 86400),
    )
    return GovernanceConfig(
        namespaces=namespaces,
        admin_gids=_ids(access.get("admin_gids", []), "access.admin_gids"),
        keys=keys_cfg,
        audit=audit_cfg,
    )


def namespace_retention(
    gov: GovernanceConfig, policies: tuple[RetentionPolicy, ...]
) -> tuple[RetentionPolicy, ...]:
    """``policies`` plus, for each namespace naming a retention class, that class applied
    to the namespace's run directories (after the explicit policies: a policy with a path
    still wins where it matches)."""
    named = {p.name: p for p in policies if p.name is not None}
    derived: list[RetentionPolicy] = []
    for ns in gov.namespaces:
        if ns.retention is None:
            continue
        if ns.retention not in named:
            raise ConfigError(
                f"{ns.origin}.retention: no [[retention]] table is named {ns.retention!r} "
                f"(named: {', '.join(sorted(n for n in named if n)) or 'none'})"
            )
        derived.append(dataclasses.replace(named[ns.retention], glob=ns.path + "/*"))
    return policies + tuple(derived)


def check_governance(cfg: Config) -> None:
    """The checks that need the whole config: every namespace has an allowed local tier
    (and an allowed remote tier where a remote durability policy covers it), and no key
    file lives in the state dir. Raises ConfigError naming the keys."""
    gov = cfg.governance
    for ns in gov.namespaces:
        if ns.allowed_locations is None:
            continue
        if not any(ns.allows_location(t.location) for t in cfg.tiers):
            have = ", ".join(sorted({f"{t.name}={t.location}" for t in cfg.tiers}))
            raise ConfigError(
                f"{ns.origin}.allowed_locations: {list(ns.allowed_locations)} allows none of "
                f"the local tiers (tier.location: {have}); its chunks could not be written"
            )
        for pol in cfg.policies:
            if pol.durability == "remote" and (pol.covers(ns.path) or ns.covers(pol.path)) and (
                not any(ns.allows_location(t.location) for t in cfg.remote_tiers)
            ):
                raise ConfigError(
                    f"{ns.origin}.allowed_locations: {list(ns.allowed_locations)} allows no "
                    f"remote tier, but policy {pol.path!r} asks durability = \"remote\""
                )
    _check_snapshot_residency(cfg)
    state = cfg.state_dir.absolute()
    for key, path in (("keys.kek_file", gov.keys.kek_file),
                      ("audit.signing_key_file", gov.audit.signing_key_file)):
        if path is not None and (path == state or state in path.parents):
            raise ConfigError(f"{key}: {path} is inside the state dir {state}; keep keys "
                              f"outside it (a copy of the state dir must not carry them)")


def _check_snapshot_residency(cfg: Config) -> None:
    """The catalog snapshot carries every namespace's metadata, so it goes only to remote
    tiers every bound namespace allows; a ``durability = "remote"`` close waits for one,
    so such a policy needs at least one."""
    bound = [ns for ns in cfg.governance.namespaces if ns.allowed_locations is not None]
    remote_policies = [p for p in cfg.policies if p.durability == "remote"]
    if not bound or not remote_policies or not cfg.remote_tiers:
        return
    if any(all(ns.allows_location(t.location) for ns in bound) for t in cfg.remote_tiers):
        return
    have = ", ".join(sorted(f"{t.name}={t.location}" for t in cfg.remote_tiers))
    raise ConfigError(
        f"{', '.join(f'{ns.origin}.allowed_locations' for ns in bound)}: no remote tier is in "
        f"every namespace's allowed locations (tier.location: {have}), so no remote tier may "
        f"hold the catalog snapshot that policy {remote_policies[0].path!r} (durability = "
        f"\"remote\") waits for"
    )
