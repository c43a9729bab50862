"""Value checks shared by the config loaders: sizes, seconds, integers, choices, strings,
a section's table and its keys, arrays of tables, the metrics address. Each raises
ConfigError whose message starts with the key it was given (``tier[1].capacity: ...``)."""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any, TypeVar

from ..errors import ConfigError
from .model import GiB, KiB

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": KiB, "M": 1024 * KiB, "G": GiB, "T": 1024 * GiB}

S = TypeVar("S", bound=str)

# The largest size any setting may name: the catalog's signed 64-bit integers.
MAX_SIZE = 2**63 - 1


def section(data: dict[str, Any], name: str, allowed: set[str]) -> dict[str, Any]:
    """The ``[name]`` table of ``data`` ({} when absent), its keys checked."""
    raw = data.get(name, {})
    if not isinstance(raw, dict):
        raise ConfigError(f"{name}: expected a table ([{name}])")
    for key in raw:
        if key not in allowed:
            raise ConfigError(f"{name}.{key}: unknown key (allowed: {', '.join(sorted(allowed))})")
    return raw


def parse_size(value: object, key: str) -> int:
    """Parse ``4194304``, ``"4MiB"``, ``"512M"`` or ``"1.5GiB"`` into bytes."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a size, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{key}: size must not be negative, got {value}")
        return _bounded(value, value, key)
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            unit = (m.group(2) or "").upper()[:1]
            # Exact (a float loses digits, and a long one overflows to infinity).
            return _bounded(int(Fraction(m.group(1)) * _UNITS[unit]), value, key)
    raise ConfigError(f"{key}: expected a size such as 4194304 or \"4MiB\", got {value!r}")


def _bounded(n: int, value: object, key: str) -> int:
    if n > MAX_SIZE:
        raise ConfigError(f"{key}: {value!r} is more than {MAX_SIZE} bytes")
    return n


def take_str(table: dict[str, Any], key: str, where: str) -> str:
    value = table[key]
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def take_weight(table: dict[str, Any], key: str) -> float:
    weight = table.get("weight", 1.0)
    if (
        isinstance(weight, bool)
        or not isinstance(weight, int | float)
        or not math.isfinite(weight)
        or weight <= 0
    ):
        raise ConfigError(f"{key}: expected a positive number, got {weight!r}")
    return float(weight)


def take_bool(value: object, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    return value


def int_key(data: dict[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"{key}: expected an integer from {lo} to {hi}, got {value!r}")
    return value


def seconds(value: object, key: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise ConfigError(f"{key}: expected a number of seconds from {lo:g} to {hi:g}, got {value!r}")
    return float(value)


def choice(value: object, key: str, choices: tuple[S, ...], *, quoted: bool = True) -> S:
    """``value`` if it is one of ``choices``; the error lists them (in quotes unless not
    ``quoted``: the older keys' messages list them bare)."""
    for c in choices:
        if value == c:
            return c
    listed = ", ".join(map(repr, choices)) if quoted else ", ".join(choices)
    raise ConfigError(f"{key}: expected one of {listed}, got {value!r}")


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
