"""No user stops the daemon (docs/concurrency.md "No user stops the daemon").

An unexpected error (a bug: anything but a CkptfsError the code handles) in a background
task must not end the daemon's nursery, which would take the mount, every namespace on it,
away. Long-running services run under ``supervised``: the error is logged with its
traceback, counted in ``Stats`` (``ckptfs status`` and /metrics say the service is
degraded) and the service starts again after a backoff. One-shot tasks beside the requests
(a spill round, a sync-behind, a heal) run under ``contained``: logged and counted, the
task's own ``finally`` blocks having woken whoever waited for it.

``CKPTFS_TEST_FAULTS`` (tests only): a comma-separated list of service names (``uploader``,
``tracker``, ...), task names (``spill``, ``sync-behind``, ...) and FUSE operations
(``fuse.mkdir``, ...): each raises ``InjectedFault`` once (a service at its first start, a
task as it ends, a request as it begins), so a test proves the containment on a real mount.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable

import trio

from .errors import CatalogUnavailable
from .stats import Stats

log = logging.getLogger("ckptfs.supervise")

RETRY_MIN_S = 1.0
RETRY_MAX_S = 30.0

_FAULTS = {n.strip() for n in os.environ.get("CKPTFS_TEST_FAULTS", "").split(",") if n.strip()}


class InjectedFault(RuntimeError):
    """An unexpected error a test asked for (``CKPTFS_TEST_FAULTS``)."""


def inject(name: str) -> None:
    """Raise ``InjectedFault`` the first time ``name`` gets here, if a test listed it."""
    if _FAULTS and name in _FAULTS:
        _FAULTS.discard(name)
        raise InjectedFault(f"fault injected into {name} (CKPTFS_TEST_FAULTS)")


def failed(stats: Stats | None, name: str, exc: BaseException) -> None:
    """Log and count an unexpected error of service or task ``name``."""
    log.error("unexpected error in %s (contained; the daemon goes on)", name, exc_info=exc)
    if stats is not None:
        stats.service_failed(name, f"{type(exc).__name__}: {exc}")


def outage(exc: BaseException) -> CatalogUnavailable | None:
    """The catalog outage ``exc`` is (alone, or every leaf of an exception group)."""
    if isinstance(exc, CatalogUnavailable):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        match, rest = exc.split(CatalogUnavailable)
        if match is not None and rest is None:
            leaf: BaseException = match
            while isinstance(leaf, BaseExceptionGroup):
                leaf = leaf.exceptions[0]
            return leaf if isinstance(leaf, CatalogUnavailable) else None
    return None


async def supervised(stats: Stats | None, name: str,
                     fn: Callable[..., Awaitable[object]], *args: object) -> None:
    """Run service ``fn`` until it returns; after an error, again after a backoff
    (RETRY_MIN_S doubling to RETRY_MAX_S; back to RETRY_MIN_S after a run longer than
    RETRY_MAX_S). A catalog outage (a shared catalog's database went away) pauses it,
    logged as such; any other error is a bug: logged with its traceback and counted.
    Cancellation ends it as usual."""
    delay = RETRY_MIN_S
    while True:
        started = trio.current_time()
        try:
            inject(name)
            await fn(*args)
            return
        except Exception as exc:
            if trio.current_time() - started > RETRY_MAX_S:
                delay = RETRY_MIN_S  # it ran well for a while: a new failure, not the same one
            cause = outage(exc)
            if cause is None:
                failed(stats, name, exc)
            else:
                log.warning("%s paused, retry in %.0f s: %s",
                            getattr(fn, "__qualname__", fn), delay, cause)
        await trio.sleep(delay)
        delay = min(delay * 2, RETRY_MAX_S)


async def contained(stats: Stats | None, name: str,
                    fn: Callable[..., Awaitable[object]], *args: object) -> None:
    """Run one-shot task ``fn``; an unexpected error is logged and counted, not raised.
    (A test's fault comes after the task's work, its ``finally`` blocks run.)"""
    try:
        await fn(*args)
        inject(name)
    except Exception as exc:
        failed(stats, name, exc)
