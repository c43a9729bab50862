"""Configuration: TOML loaded into frozen dataclasses, validated strictly.

Every error names the offending key (``tier[1].path``) so an operator can fix it at once.
Unknown keys are errors: a typo must never silently fall back to a default.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
MIN_CHUNK_SIZE = 64 * KiB
MAX_CHUNK_SIZE = 64 * MiB

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
    name: str
    kind: str  # "local" for now; "s3" comes with the remote tier
    path: Path
    location: str = "local"
    weight: float = 1.0
    capacity: int | None = None  # optional cap in bytes; None means the device's free space


@dataclass(frozen=True)
class Config:
    state_dir: Path
    tiers: tuple[TierConfig, ...]
    chunk_size: int = DEFAULT_CHUNK_SIZE
    memory_budget: int = DEFAULT_MEMORY_BUDGET
    io_threads: int = DEFAULT_IO_THREADS
    allow_other: bool = False
    source: str = field(default="<embedded default>", compare=False)

    @property
    def catalog_path(self) -> Path:
        return self.state_dir / "catalog.sqlite"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "ckptfs.log"


_TOP_KEYS = {"state_dir", "chunk_size", "memory_budget", "io_threads", "allow_other", "tier"}
_TIER_KEYS = {"name", "kind", "path", "location", "weight", "capacity"}


def _take_str(table: dict[str, Any], key: str, where: str) -> str:
    value = table[key]
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _tier_from_table(table: object, index: int) -> TierConfig:
    where = f"tier[{index}]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table ([[tier]])")
    for key in table:
        if key not in _TIER_KEYS:
            raise ConfigError(f"{where}.{key}: unknown key (allowed: {', '.join(sorted(_TIER_KEYS))})")
    for key in ("name", "kind", "path"):
        if key not in table:
            raise ConfigError(f"{where}.{key}: missing required key")
    name = _take_str(table, "name", f"{where}.name")
    if not _NAME_RE.match(name):
        raise ConfigError(f"{where}.name: {name!r} must be 1-64 of [A-Za-z0-9_.-]")
    kind = _take_str(table, "kind", f"{where}.kind")
    if kind != "local":
        raise ConfigError(f"{where}.kind: unsupported tier kind {kind!r} (supported: local)")
    path = Path(_take_str(table, "path", f"{where}.path"))
    if not path.is_absolute():
        raise ConfigError(f"{where}.path: must be an absolute path, got {str(path)!r}")
    location = _take_str(table, "location", f"{where}.location") if "location" in table else "local"
    weight = table.get("weight", 1.0)
    if (
        isinstance(weight, bool)
        or not isinstance(weight, int | float)
        or not math.isfinite(weight)
        or weight <= 0
    ):
        raise ConfigError(f"{where}.weight: expected a positive number, got {weight!r}")
    capacity = None
    if "capacity" in table:
        capacity = parse_size(table["capacity"], f"{where}.capacity")
        if capacity <= 0:
            raise ConfigError(f"{where}.capacity: must be positive")
    return TierConfig(name, kind, path, location, float(weight), capacity)


def local_tiers_from_paths(paths: list[str]) -> tuple[TierConfig, ...]:
    tiers = []
    for i, p in enumerate(paths):
        path = Path(p).expanduser().absolute()
        tiers.append(TierConfig(name=f"local{i}", kind="local", path=path))
    return tuple(tiers)


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
    io_threads = data.get("io_threads", DEFAULT_IO_THREADS)
    if isinstance(io_threads, bool) or not isinstance(io_threads, int) or not 1 <= io_threads <= 256:
        raise ConfigError(f"io_threads: expected an integer from 1 to 256, got {io_threads!r}")
    allow_other = data.get("allow_other", False)
    if not isinstance(allow_other, bool):
        raise ConfigError(f"allow_other: expected true or false, got {allow_other!r}")
    raw_tiers = data.get("tier", [])
    if not isinstance(raw_tiers, list):
        raise ConfigError("tier: expected an array of tables ([[tier]])")
    tiers = tuple(_tier_from_table(t, i) for i, t in enumerate(raw_tiers))
    names = [t.name for t in tiers]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ConfigError(f"tier[{i}].name: duplicate tier name {name!r}")
    return Config(
        state_dir=state_dir,
        tiers=tiers,
        chunk_size=chunk_size,
        memory_budget=memory_budget,
        io_threads=io_threads,
        allow_other=allow_other,
        source=source,
    )


def recorded_tiers(state_dir: Path) -> tuple[TierConfig, ...]:
    """The tiers an existing catalog was last mounted with (read-only; empty if none)."""
    import json
    import sqlite3

    db = state_dir / "catalog.sqlite"
    if not db.exists():
        return ()
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            row = conn.execute("SELECT value FROM meta WHERE key='tiers'").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return ()
    if row is None:
        return ()
    return tuple(
        TierConfig(name=t["name"], kind=t["kind"], path=Path(t["path"]), location=t["location"])
        for t in json.loads(row[0])
    )


def load_config(
    path: str | Path | None = None,
    *,
    state_dir: str | Path | None = None,
    local_dirs: list[str] | None = None,
    chunk_size: str | int | None = None,
) -> Config:
    """Build the effective config: file (if any), then command-line overrides, then defaults.

    With no file and no ``--local``, the tiers recorded in an existing catalog apply (so a
    remount needs only ``--state-dir``); for a new state dir, the embedded default: one
    local tier under the state directory.
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
        taken = {t.name for t in tiers}
        renamed = []
        for i, t in enumerate(extra):
            name = t.name
            n = i
            while name in taken:
                n += 1
                name = f"local{n}"
            taken.add(name)
            renamed.append(TierConfig(name, t.kind, t.path, t.location, t.weight, t.capacity))
        tiers = tiers + tuple(renamed)
    if not tiers:
        tiers = recorded_tiers(cfg.state_dir)
    if not tiers:
        tiers = (TierConfig(name="local0", kind="local", path=cfg.state_dir / "tiers" / "local0"),)
    paths = [t.path for t in tiers]
    for i, p in enumerate(paths):
        if p in paths[:i]:
            raise ConfigError(f"tier[{i}].path: {p} is used by two tiers")
    return Config(
        state_dir=cfg.state_dir,
        tiers=tiers,
        chunk_size=cfg.chunk_size,
        memory_budget=cfg.memory_budget,
        io_threads=cfg.io_threads,
        allow_other=cfg.allow_other,
        source=source,
    )
