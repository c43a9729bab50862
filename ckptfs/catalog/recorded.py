"""The tiers a state dir's catalog was last mounted with, as config models: a remount
with only ``--state-dir`` mounts them again (config.load_config asks through this)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config.model import CATALOG_FILE, S3TierConfig, TierConfig
from .catalog import read_recorded_tiers


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
    remote = tuple(remote_tier_of(t) for t in records if t.get("kind") == "s3")
    return local, remote


def remote_tier_of(t: dict[str, Any]) -> S3TierConfig:
    """The S3 tier one catalog record names (recorded from a checked config)."""
    return S3TierConfig(
        name=t["name"], bucket=t["bucket"], prefix=t.get("prefix", ""),
        endpoint_url=t.get("endpoint_url"), region=t.get("region", "us-east-1"),
        addressing_style=t.get("addressing_style", "path"), location=t.get("location", "remote"),
    )
