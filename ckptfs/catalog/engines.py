"""Which catalog engine serves a mount or a command: the state dir's embedded SQLite file,
or the shared PostgreSQL database its binding file names (statedir.read_binding)."""

from __future__ import annotations

from pathlib import Path

from .. import statedir
from ..config.model import CATALOG_FILE
from .catalog import SqliteCatalog
from .postgres import PostgresCatalog
from .protocols import Catalog as CatalogProtocol


def open_shared_catalog(url: str, *, pool_size: int, readonly: bool = False) -> CatalogProtocol:
    """The shared catalog at ``url`` (PostgreSQL); its first opener creates the schema."""
    return PostgresCatalog(url, pool_size=pool_size, readonly=readonly)


def shared_binding(state_dir: Path) -> tuple[str, str] | None:
    """(catalog URI, node) if this state dir's node uses a shared catalog."""
    return statedir.read_binding(state_dir)


def open_state_dir_catalog(state_dir: Path, readonly: bool = True) -> CatalogProtocol:
    """The catalog a state dir's daemon uses, for a command beside it (read-only by
    default): its SQLite file, or the shared database it is bound to."""
    binding = statedir.read_binding(state_dir)
    if binding is not None:
        return open_shared_catalog(binding[0], pool_size=1, readonly=readonly)
    return SqliteCatalog(state_dir / CATALOG_FILE, readonly=readonly)
