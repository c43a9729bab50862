"""``user.ckptfs.checkpoints``: the checkpoints under a directory, as the daemon sees them,
for a caller who cannot read the state dir (``ckptfs ls``, ``show``, ``latest``,
``verify`` and ``status`` run as a user other than the daemon's). Only the checkpoints in
namespaces the caller may reach are listed (vfs/access.py).

An attribute value holds at most 64 KiB (Linux), so the answer comes in pages: the value
is JSON ``{"checkpoints": [...], "next": ID}``; while ``next`` is not null the command
reads ``user.ckptfs.checkpoints.ID`` for the rows after it. Each row is a summary
(checkpoints/summary.py) plus the row's ``id``, ``begin_ns`` and ``commit_ns``; its
``path`` is left to the command (the daemon does not know where the caller sees the mount).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol, cast

from ..catalog import Catalog, CheckpointRow
from ..catalog.protocols import (
    CheckpointCatalog,
    ContentsCatalog,
    MetaCatalog,
    NamespaceCatalog,
    SessionCatalog,
)
from ..checkpoints.reach import Reach
from ..checkpoints.summary import summarize
from ..errors import InvalidArgument

XATTR_LIST = b"user.ckptfs.checkpoints"
PAGE_BYTES = 60_000  # below the 64 KiB an xattr value may hold, with room for "next"

Db = Callable[..., Awaitable[Any]]


class ListingCatalog(CheckpointCatalog, NamespaceCatalog, ContentsCatalog, MetaCatalog,
                     SessionCatalog, Protocol):
    """What a listing reads: the checkpoint rows, and for each summary its files, their
    extents, the recorded tiers and the live sessions (checkpoints/summary.py, reach.py)."""

    shared: bool


def page_after(name: bytes) -> int | None:
    """The id a page starts after (0: the first page), or None if ``name`` is not ours."""
    if name == XATTR_LIST:
        return 0
    if not name.startswith(XATTR_LIST + b"."):
        return None
    tail = name[len(XATTR_LIST) + 1:]
    if not tail.isdigit():
        raise InvalidArgument(f"{name.decode(errors='replace')}: not a page of the listing")
    return int(tail)


async def listing(catalog: ListingCatalog, db: Db, under: str, after: int,
                  visible: Callable[[str], bool]) -> bytes:
    """One page of the checkpoints under ``under`` with an id above ``after``, those whose
    root ``visible`` accepts. Each summary is its own catalog call: a long listing does
    not hold the catalog from the filesystem's requests."""
    rows: list[CheckpointRow] = [r for r in await db(catalog.checkpoint_rows, under)
                                 if r.id > after and visible(r.root)]
    reach: Reach = await db(Reach.of, catalog)
    # summarize is typed against the whole Catalog (checkpoints/summary.py) but reads only
    # the roles of ListingCatalog.
    whole = cast(Catalog, catalog)
    out: list[dict[str, Any]] = []
    size = 0
    for r in rows:
        info = asdict(await db(summarize, whole, Path(""), r, reach))
        info.update(id=r.id, begin_ns=r.begin_ns, commit_ns=r.commit_ns, path=None)
        item = json.dumps(info, sort_keys=True)
        if out and size + len(item) + 2 > PAGE_BYTES:
            return json.dumps({"checkpoints": out, "next": out[-1]["id"]}).encode()
        out.append(info)
        size += len(item) + 2
    return json.dumps({"checkpoints": out, "next": None}).encode()
