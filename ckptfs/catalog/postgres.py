"""Placeholder until the PostgreSQL engine (helper branch) is merged."""

from __future__ import annotations

from ..errors import CkptfsError


class PostgresCatalog:
    concurrency = 1

    def __init__(self, url: str, *, pool_size: int = 4, readonly: bool = False) -> None:
        raise CkptfsError("the PostgreSQL engine is not merged yet")
