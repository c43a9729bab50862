"""What a catalog engine calls back (catalog/hooks.py), given when it is opened: on every
engine, through the open functions the daemon and the commands use."""

from __future__ import annotations

import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckptfs.catalog.audit import AuditRecord
from ckptfs.catalog.engines import open_catalog, open_state_dir_catalog
from ckptfs.catalog.hooks import CatalogHooks
from ckptfs.catalog.protocols import Catalog
from ckptfs.catalog.rows import ROOT_INODE
from ckptfs.config.model import CATALOG_FILE
from ckptfs.errors import AlreadyExists

R = ROOT_INODE
F = stat.S_IFREG | 0o644


class Calls:
    """What the hooks saw: the thread of each call."""

    def __init__(self) -> None:
        self.touched: list[threading.Thread] = []
        self.noted: list[threading.Thread] = []

    def hooks(self, node: str) -> CatalogHooks:
        return CatalogHooks(on_touch=lambda: self.touched.append(threading.current_thread()),
                            on_audit_note=lambda: self.noted.append(threading.current_thread()),
                            node=node)


@pytest.fixture
def calls() -> Calls:
    return Calls()


@pytest.fixture(params=["sqlite", "postgres"])
def cat(request: pytest.FixtureRequest, tmp_path: Path, calls: Calls) -> Iterator[Catalog]:
    where = (str(tmp_path / "c.sqlite") if request.param == "sqlite"
             else str(request.getfixturevalue("pg_url")))
    c = open_catalog(where, pool_size=2, hooks=calls.hooks("node-7"))
    try:
        yield c
    finally:
        c.close()


def test_on_touch_follows_each_change_of_the_namespace_or_contents(
    cat: Catalog, calls: Calls
) -> None:
    cat.set_meta("x", "1")  # no namespace or content change
    assert calls.touched == []
    cat.create(R, b"f", F, 0, 0)
    assert calls.touched == [threading.current_thread()]  # after the commit, the caller's
    cat.setattr(cat.lookup(R, b"f").ino, mode=0o600)
    assert len(calls.touched) == 2
    with pytest.raises(AlreadyExists):  # refused: it committed nothing
        cat.create(R, b"f", F, 0, 0)
    assert len(calls.touched) == 2


def test_audit_records_name_the_hooks_node_and_a_note_calls_its_hook(
    cat: Catalog, calls: Calls
) -> None:
    f = cat.create(R, b"f", F, 0, 0, audit=AuditRecord("create", uid=1))
    assert cat.audit_node == "node-7"
    cat.audit_note(AuditRecord("open", uid=1, ino=f.ino))
    assert calls.noted == [threading.current_thread()]
    cat.audit_flush()
    assert [(e.action, e.node) for e in cat.audit_entries()] == [
        ("create", "node-7"), ("open", "node-7")]


def test_a_state_dir_catalog_takes_hooks_too(tmp_path: Path, calls: Calls) -> None:
    open_catalog(tmp_path / CATALOG_FILE).close()  # made by a daemon
    c = open_state_dir_catalog(tmp_path, readonly=False, hooks=calls.hooks("n"))
    try:
        c.create(R, b"f", F, 0, 0)
        assert len(calls.touched) == 1 and c.hooks.node == "n"
    finally:
        c.close()
