"""The catalog conformance suite (catalog_conformance.py) on every catalog engine: SQLite
(a file) and PostgreSQL (a fresh database on the test server, pgfixtures.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.catalog_conformance import CatalogConformance

from ckptfs.catalog import open_catalog
from ckptfs.catalog.protocols import Catalog


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def catalog(engine: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Catalog]:
    """An empty catalog of ``engine``."""
    where: Path | str = tmp_path / "catalog.sqlite"
    if engine == "postgresql":
        where = str(request.getfixturevalue("pg_url"))
    c = open_catalog(where)
    try:
        yield c
    finally:
        c.close()


class TestCatalog(CatalogConformance):
    pass
