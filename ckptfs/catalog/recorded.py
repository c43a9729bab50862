"""The tiers a state dir's catalog was last mounted with, as config models: a remount
with only ``--state-dir`` mounts them again (config.load_config asks through this)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .. import statedir
from ..config.model import CATALOG_FILE, S3TierConfig, TierConfig
from .catalog import read_recorded_tiers
from .engines import open_shared_catalog


def recorded_tiers(state_dir: Path) -> tuple[tuple[TierConfig, ...], tuple[S3TierConfig, ...]]:
    """The local and remote tiers an existing catalog was last mounted with (read-only)."""
    binding = statedir.read_binding(state_dir)
    records = (read_recorded_tiers(state_dir / CATALOG_FILE) if binding is None
               else _node_records(*binding))
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


def _node_records(url: str, node: str) -> list[dict[str, Any]] | None:
    """A shared catalog records every node's tiers: this node's local ones and the remotes."""
    catalog = open_shared_catalog(url, pool_size=1, readonly=True)
    try:
        raw = catalog.get_meta("tiers")
    finally:
        catalog.close()
    if raw is None:
        return None
    return [t for t in json.loads(raw)
            if t.get("kind", "local") != "local" or str(t.get("name", "")).startswith(f"{node}:")]


def remote_tier_of(t: dict[str, Any]) -> S3TierConfig:
    """The S3 tier one catalog record names (recorded from a checked config)."""
    return S3TierConfig(
        name=t["name"], bucket=t["bucket"], prefix=t.get("prefix", ""),
        endpoint_url=t.get("endpoint_url"), region=t.get("region", "us-east-1"),
        addressing_style=t.get("addressing_style", "path"), location=t.get("location", "remote"),
    )
