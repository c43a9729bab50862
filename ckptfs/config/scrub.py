"""The ``[scrub]`` section: the scrubber's rate, interval, pause and switch (model.py
ScrubConfig; docs/operations.md "The scrubber")."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .model import ScrubConfig
from .parse import parse_size, seconds, section, take_bool

_KEYS = {"enabled", "rate", "interval", "pause_while_writing"}
MIN_RATE = 64 * 1024  # bytes/s: a slower scrub never finishes a pass


def scrub_from(data: dict[str, Any]) -> ScrubConfig:
    raw = section(data, "scrub", _KEYS)
    d = ScrubConfig()
    rate = parse_size(raw.get("rate", d.rate), "scrub.rate")
    if rate < MIN_RATE:
        raise ConfigError(f"scrub.rate: {rate} bytes/s is less than {MIN_RATE} (64KiB)")
    return ScrubConfig(
        enabled=take_bool(raw.get("enabled", d.enabled), "scrub.enabled"),
        rate=rate,
        interval_s=seconds(raw.get("interval", d.interval_s), "scrub.interval", 1, 365 * 86400),
        pause_while_writing=take_bool(raw.get("pause_while_writing", d.pause_while_writing),
                                      "scrub.pause_while_writing"),
    )
