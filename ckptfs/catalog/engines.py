"""Which catalog engine serves a mount or a command: the state dir's embedded SQLite file,
or the shared PostgreSQL database its binding file names (statedir.read_binding).

The PostgreSQL engine (postgres.py, and with it psycopg and its pool) is imported only by
a process that opens a shared catalog: a daemon or a command on a SQLite catalog never
pays for it (about 0.2 s at every start)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .. import statedir
from ..config.model import CATALOG_FILE
from .hooks import CatalogHooks
from .protocols import Catalog as CatalogProtocol
from .sql import SqlCatalog
from .sqlite import SqliteCatalog

if TYPE_CHECKING:
    from .postgres import PostgresCatalog


def postgres_engine() -> type[PostgresCatalog]:
    """The PostgreSQL engine's class (postgres.py), imported on first use."""
    # Deferred (no cycle): psycopg would cost every SQLite-only process ~0.2 s at start.
    from .postgres import PostgresCatalog

    return PostgresCatalog


def is_database_url(where: str | Path) -> bool:
    """Whether ``where`` names a PostgreSQL database (a libpq URI) rather than a file."""
    return isinstance(where, str) and where.startswith(("postgresql://", "postgres://"))


def open_catalog(where: Path | str, readonly: bool = False, *, pool_size: int = 4) -> SqlCatalog:
    """The catalog at ``where``: a SQLite file (a path), or a PostgreSQL database (a
    ``postgresql://`` URI, with ``pool_size`` connections)."""
    if is_database_url(where):
        return postgres_engine()(str(where), pool_size=pool_size, readonly=readonly)
    return SqliteCatalog(Path(where), readonly=readonly)


def open_shared_catalog(
    url: str, *, pool_size: int, readonly: bool = False, hooks: CatalogHooks | None = None,
) -> CatalogProtocol:
    """The shared catalog at ``url`` (PostgreSQL); its first opener creates the schema."""
    return postgres_engine()(url, pool_size=pool_size, readonly=readonly, hooks=hooks)


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
