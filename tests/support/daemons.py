"""Daemons built in the test process through the composition root (daemon/build.py),
with the options a test names by their config fields."""

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ckptfs.catalog import SqliteCatalog
from ckptfs.catalog.protocols import Catalog
from ckptfs.config.model import StoreConfig
from ckptfs.daemon.build import Daemon, Kernel, Sections, Wakeups, build
from ckptfs.tiers.base import Tier

CS = 64 * 1024


def hooked_sqlite(path: Path) -> tuple[SqliteCatalog, Wakeups]:
    """A SQLite catalog opened as the daemon opens it: with the wake-ups as its hooks."""
    wakeups = Wakeups()
    return SqliteCatalog(path, hooks=wakeups.catalog_hooks()), wakeups


def build_daemon(
    cat: Catalog, tiers: Sequence[Tier], wakeups: Wakeups | None = None, **options: Any
) -> Daemon:
    """``build`` with each option given where it belongs: a StoreConfig field (memory_budget,
    on_local_full, ...), a config section (reads, upload, checkpoints, governance, ...), a
    kernel callback (invalidate, store_pages), else a ``build`` argument. A small memory
    budget (8 chunks of 64 KiB), two I/O threads and 64 KiB chunks unless named."""
    chunk_size = options.pop("chunk_size", CS)

    def take(cls: Any) -> dict[str, Any]:
        return {f.name: options.pop(f.name) for f in dataclasses.fields(cls) if f.name in options}

    store = StoreConfig(**{"memory_budget": 8 * CS, "io_threads": 2, **take(StoreConfig)})
    sections = Sections(store=store, **take(Sections))
    return build(cat, tiers, chunk_size=chunk_size, sections=sections, kernel=Kernel(**take(Kernel)),
                 wakeups=wakeups, **options)
