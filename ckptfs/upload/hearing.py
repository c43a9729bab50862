"""Hearing another node's events (a shared catalog): a task that waits on a catalog
listener (catalog/deletion_events.py, catalog/wants.py) in a worker thread of its own and
calls back at each event, for the uploader and the deleter.

An event is a notification or a (re)connection: notifications sent while no LISTEN was
active are lost, so the callback makes its owner read the catalog again, and no wakeup is
lost across a database outage. While the database cannot be reached, the wait is retried
with backoff (the task never ends on an outage); the listener is closed when the task
ends (cancelled, or the listener closed).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from ..catalog.deletion_events import Listener
from ..errors import CatalogUnavailable

__all__ = ["LISTEN_RETRY_MAX_S", "LISTEN_RETRY_MIN_S", "hear"]

# After a failed LISTEN, again after this long, doubling up to the max (as the other
# background services do).
LISTEN_RETRY_MIN_S = 1.0
LISTEN_RETRY_MAX_S = 30.0


async def hear(
    listener: Listener, on_heard: Callable[[], None], what: str, log: logging.Logger,
) -> None:
    """Call ``on_heard`` (trio thread) at each event of ``listener`` until it is closed or
    this task is cancelled; ``what`` names the events in the log ("other nodes' waits for
    chunks")."""
    # The wait holds its thread for as long as nothing happens: a limiter of its own, so
    # it never takes a catalog slot.
    limiter = trio.CapacityLimiter(1)
    failures = 0
    try:
        while True:
            try:
                heard = await trio.to_thread.run_sync(
                    listener.wait, limiter=limiter, abandon_on_cancel=True
                )
            except CatalogUnavailable as exc:
                if failures == 0:
                    log.warning("not hearing %s (retrying): %s", what, exc)
                failures += 1
                await trio.sleep(min(LISTEN_RETRY_MAX_S,
                                     LISTEN_RETRY_MIN_S * 2 ** min(failures - 1, 10)))
                continue
            if failures:
                log.info("hearing %s again", what)
                failures = 0
            if not heard:
                return
            on_heard()
    finally:
        with trio.CancelScope(shield=True):  # a wait in its thread returns at once
            await trio.to_thread.run_sync(listener.close)
