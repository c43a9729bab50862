"""The catalog conformance suite (catalog_conformance.py) on every catalog engine: SQLite
now; the PostgreSQL engine (issue 14) adds its parameter to ``engine``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.catalog_conformance import CatalogConformance

from ckptfs.catalog import open_catalog
from ckptfs.catalog.protocols import Catalog


@pytest.fixture(params=["sqlite"])
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def catalog(engine: str, tmp_path: Path) -> Iterator[Catalog]:
    """An empty catalog of ``engine``."""
    assert engine == "sqlite"
    c = open_catalog(tmp_path / "catalog.sqlite")
    try:
        yield c
    finally:
        c.close()


class TestCatalog(CatalogConformance):
    pass
