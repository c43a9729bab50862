"""A ``[[namespace]]``'s root directory as the config asks for it: ``owner``, ``group``
(names or numbers) and ``mode`` (an octal string), checked, with their defaults: the
namespace's first uid and gid, mode 0700 (0770 for a namespace owned by groups). The daemon
creates a missing root with them at mount (daemon/provision.py, docs/governance.md)."""

from __future__ import annotations

import grp
import pwd
import re
from typing import Any

from ..errors import ConfigError

ROOT_KEYS = {"owner", "group", "mode"}
MAX_ID = 2**32 - 2  # (uid_t)-1 means "no id"
_OCTAL_RE = re.compile(r"^(?:0o)?([0-7]{1,5})$")


def _id(value: object, key: str, kind: str) -> int:
    """A number, or a name of this host's user (``kind`` "user") or group database."""
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value <= MAX_ID:
            raise ConfigError(f"{key}: expected an id from 0 to {MAX_ID}, got {value!r}")
        return value
    if not isinstance(value, str) or not value or "\x00" in value:
        raise ConfigError(f"{key}: expected a {kind} name or a numeric id, got {value!r}")
    try:
        return pwd.getpwnam(value).pw_uid if kind == "user" else grp.getgrnam(value).gr_gid
    except KeyError:
        raise ConfigError(f"{key}: no {kind} named {value!r} on this host") from None


def parse_mode(value: object, key: str) -> int:
    """``"0750"``, ``"750"`` or ``"0o750"``: permission bits (setuid, setgid and sticky
    allowed). A TOML integer is refused: ``mode = 750`` would be decimal."""
    m = _OCTAL_RE.match(value) if isinstance(value, str) else None
    if m is None or int(m.group(1), 8) > 0o7777:
        raise ConfigError(f"{key}: expected an octal mode as a string, e.g. \"0750\", "
                          f"got {value!r}")
    return int(m.group(1), 8)


def _primary_gid(uid: int) -> int:
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:  # a number of no local user (ids from a directory service)
        return 0


def root_of(table: dict[str, Any], where: str, uids: tuple[int, ...],
            gids: tuple[int, ...]) -> tuple[int, int, int]:
    """(uid, gid, mode) of the namespace root. Defaults: the first uid (root without
    uids), the first gid (without gids: the owner's primary group, or 0), 0700 (0770
    with gids: the group owns it too). An owner and group of whom neither may reach the
    namespace are refused: nobody who owns the root could use it."""
    owner_set = "owner" in table
    uid = _id(table["owner"], f"{where}.owner", "user") if owner_set else (uids[0] if uids else 0)
    if "group" in table:
        gid = _id(table["group"], f"{where}.group", "group")
    else:
        gid = gids[0] if gids else _primary_gid(uid)
    default_mode = 0o770 if gids else 0o700
    mode = parse_mode(table["mode"], f"{where}.mode") if "mode" in table else default_mode
    if uid not in uids and gid not in gids:
        key = f"{where}.owner" if owner_set or "group" not in table else f"{where}.group"
        raise ConfigError(f"{key}: the root would belong to uid {uid} and gid {gid}, neither "
                          f"an owner of the namespace (uids {list(uids)}, gids {list(gids)})")
    return uid, gid, mode
