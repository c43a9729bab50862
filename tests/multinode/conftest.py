"""What the multi-node tests share: a cluster of nodes on one real PostgreSQL catalog and
one real SeaweedFS bucket, the shared catalog read beside them, and `ckptfs sync`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import TEST_MOUNT_ARGS, CkptFactory
from tests.support.mountutil import Mount, run_cli

from ckptfs.catalog import PostgresCatalog

Db = Callable[[], PostgresCatalog]


class Cluster:
    """Nodes mounted with the same --catalog and --remote; each has its own state dir."""

    def __init__(self, factory: CkptFactory, catalog: str, remote: str) -> None:
        self.factory = factory
        self.catalog = catalog
        self.remote = remote

    def node(self, name: str, *extra: str) -> Mount:
        return self.factory.mount(
            extra_args=[*TEST_MOUNT_ARGS, "--catalog", self.catalog, "--node", name,
                        "--remote", self.remote, *extra],
            name=name,
        )


@pytest.fixture
def cluster(ckpt_factory: CkptFactory, pg_url: str, remote: tuple[str, str]) -> Cluster:
    return Cluster(ckpt_factory, pg_url, remote[0])


@pytest.fixture
def db(pg_url: str) -> Iterator[Db]:
    """The shared catalog, read beside the nodes (opened once a node made the schema)."""
    cats: list[PostgresCatalog] = []

    def opened() -> PostgresCatalog:
        if not cats:
            cats.append(PostgresCatalog(pg_url, pool_size=1, readonly=True))
        return cats[0]

    yield opened
    for c in cats:
        c.close()


def sync(m: Mount, path: Path) -> None:
    res = run_cli("sync", str(path), "--timeout", "60", timeout=90)
    assert res.returncode == 0, res.stderr
