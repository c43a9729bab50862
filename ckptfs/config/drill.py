"""``[drill]`` (docs/operations.md "Restore drills"): how often the daemon drills, which
run directories, the bandwidth a drill may take from the remote, and its scratch
directory. Every error names its key (the CLI exits 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .model import DrillConfig
from .parse import parse_size, seconds, section

DRILL_KEYS = {"interval", "runs", "bandwidth", "scratch"}
MAX_INTERVAL_S = 366 * 86400


def _run_path(value: object, key: str) -> str:
    if not isinstance(value, str) or not value.startswith("/") or "\x00" in value:
        raise ConfigError(f"{key}: expected a path inside the mount starting with '/', "
                          f"got {value!r}")
    parts = [p for p in value.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise ConfigError(f"{key}: '.' and '..' are not allowed, got {value!r}")
    return "/" + "/".join(parts)


def drill_from_config(data: dict[str, Any]) -> DrillConfig:
    """The ``[drill]`` table of a config (absent: drills only on request)."""
    raw = section(data, "drill", DRILL_KEYS)
    interval = seconds(raw.get("interval", 0), "drill.interval", 0, MAX_INTERVAL_S)
    if 0 < interval < 60:
        raise ConfigError(f"drill.interval: expected 0 (off) or at least 60 seconds, got {interval:g}")
    runs = raw.get("runs", [])
    if not isinstance(runs, list):
        raise ConfigError(f"drill.runs: expected a list of paths inside the mount, got {runs!r}")
    paths = tuple(_run_path(r, f"drill.runs[{i}]") for i, r in enumerate(runs))
    if len(set(paths)) != len(paths):
        raise ConfigError("drill.runs: a run directory is named twice")
    bandwidth = parse_size(raw.get("bandwidth", 0), "drill.bandwidth")
    if 0 < bandwidth < 1 << 20:
        raise ConfigError(f"drill.bandwidth: expected 0 (no cap) or at least 1MiB (per second), "
                          f"got {bandwidth}")
    scratch = None
    if "scratch" in raw:
        value = raw["scratch"]
        if not isinstance(value, str) or not value.startswith("/") or "\x00" in value:
            raise ConfigError(f"drill.scratch: expected an absolute path, got {value!r}")
        scratch = Path(value)
    return DrillConfig(interval_s=interval, runs=paths, bandwidth=bandwidth, scratch=scratch)
