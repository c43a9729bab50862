"""The checkpoint tables of a config: ``[[checkpoint_pattern]]`` (roots the detectors
cannot know, checkpoints/detectors.py) and ``[[retention]]`` (checkpoints/retention.py),
checked into PatternConfig and RetentionPolicy. Every error names its key."""

from __future__ import annotations

import math
import re
from typing import Any

from ..errors import ConfigError
from .model import DEFAULT_QUIET_S, PATTERN_COMMITS, PatternConfig, RetentionPolicy
from .parse import array_of_tables

_PATTERN_KEYS = {"glob", "commit", "quiet_seconds", "framework"}
_LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def patterns_from_config(raw: object) -> tuple[PatternConfig, ...]:
    """Validate the ``[[checkpoint_pattern]]`` array of tables (the value of the
    ``checkpoint_pattern`` key). Every error names its key and raises ConfigError."""
    out: list[PatternConfig] = []
    for where, table in array_of_tables(
        raw, "checkpoint_pattern", set(_PATTERN_KEYS), ("glob", "commit")
    ):
        glob = _pattern_glob(table["glob"], f"{where}.glob")
        if any(p.glob == glob for p in out):
            raise ConfigError(f"{where}.glob: {glob!r} has two patterns")
        commit = _pattern_commit(table["commit"], f"{where}.commit")
        quiet_s = DEFAULT_QUIET_S
        if "quiet_seconds" in table:
            if commit != "quiescence":
                raise ConfigError(
                    f"{where}.quiet_seconds: only allowed with commit = \"quiescence\" "
                    f"(commit is {commit!r})"
                )
            value = table["quiet_seconds"]
            if (isinstance(value, bool) or not isinstance(value, int | float)
                    or not math.isfinite(value) or not 0.1 <= value <= 86400):
                raise ConfigError(
                    f"{where}.quiet_seconds: expected a number of seconds from 0.1 to 86400, "
                    f"got {value!r}"
                )
            quiet_s = float(value)
        framework = table.get("framework", "pattern")
        if not isinstance(framework, str) or not _LABEL_RE.match(framework):
            raise ConfigError(
                f"{where}.framework: expected a label of 1-64 of [A-Za-z0-9_.-], got {framework!r}"
            )
        out.append(PatternConfig(glob, commit, quiet_s, framework))
    return tuple(out)


def _pattern_glob(value: object, where: str) -> str:
    if not isinstance(value, str) or not value.startswith("/") or "\x00" in value:
        raise ConfigError(f"{where}: expected a glob inside the mount starting with '/', got {value!r}")
    parts = value.rstrip("/").split("/")[1:]
    if not parts or any(p in ("", ".", "..") for p in parts):
        raise ConfigError(
            f"{where}: empty, '.' or '..' path segments (or the mount root) are not allowed, "
            f"got {value!r}"
        )
    return "/" + "/".join(parts)


def _pattern_commit(value: object, where: str) -> str:
    if isinstance(value, str) and value in PATTERN_COMMITS:
        return value
    if isinstance(value, str) and value.startswith("file:"):
        name = value[5:]
        segs = name.split("/")
        if not name or name.startswith("/") or "\x00" in name or any(
            s in ("", ".", "..") for s in segs
        ):
            raise ConfigError(
                f"{where}: file:NAME needs a relative path inside the root, got {value!r}"
            )
        return value
    raise ConfigError(
        f"{where}: expected \"file:NAME\", \"rename\" or \"quiescence\", got {value!r}"
    )



_RETENTION_KEYS = {"name", "path", "keep_local", "keep", "milestone_every", "keep_milestones", "max_age",
         "skip_superseded_uploads"}


def _int(table: dict[str, Any], key: str, where: str, default: int, lo: int) -> int:
    v = table.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ConfigError(f"{where}.{key}: expected an integer >= {lo}, got {v!r}")
    return v


def policies_from_config(raw: object) -> tuple[RetentionPolicy, ...]:
    """Parse ``[[retention]]`` tables strictly (every error names its key)."""
    out: list[RetentionPolicy] = []
    for where, table in array_of_tables(raw, "retention", _RETENTION_KEYS):
        name = table.get("name")
        if name is not None and (not isinstance(name, str) or not _LABEL_RE.match(name)):
            raise ConfigError(
                f"{where}.name: expected a label of 1-64 of [A-Za-z0-9_.-], got {name!r}"
            )
        if name is not None and any(p.name == name for p in out):
            raise ConfigError(f"{where}.name: two [[retention]] tables are named {name!r}")
        # A named class may have no path: it covers only the namespaces that name it.
        path = table.get("path", "" if name is not None else None)
        if path != "" and (not isinstance(path, str) or not path.startswith("/")):
            raise ConfigError(f"{where}.path: expected a glob of run directories starting with "
                              f"'/', got {path!r}")
        age = table.get("max_age")
        if age is not None and (isinstance(age, bool) or not isinstance(age, int | float) or age <= 0):
            raise ConfigError(f"{where}.max_age: expected a number of seconds > 0, got {age!r}")
        skip = table.get("skip_superseded_uploads", True)
        if not isinstance(skip, bool):
            raise ConfigError(f"{where}.skip_superseded_uploads: expected true or false, got {skip!r}")
        out.append(RetentionPolicy(
            glob=(path.rstrip("/") or "/") if path else "",
            name=name,
            keep_local=_int(table, "keep_local", where, 2, 0),
            keep=_int(table, "keep", where, 5, 1),
            milestone_every=_int(table, "milestone_every", where, 0, 0),
            keep_milestones=_int(table, "keep_milestones", where, 0, 0),
            max_age_s=None if age is None else float(age),
            skip_superseded_uploads=skip,
        ))
    return tuple(out)
