"""Wake-ups shared by the task that waits and the parts that poke it.

The composition root (daemon/build.py) creates them before either side, so a component
built earlier can be handed ``wakeup.set`` for a component built later: nothing is wired
after construction. ``Wakeup`` is for the trio thread only; ``ThreadWakeup`` may be set
from any thread (the catalog's hooks and the chunk guard's release run in worker threads)
and may be made, and set, before the trio loop runs.
"""

from __future__ import annotations

import contextlib
import threading

import trio


class Wakeup:
    """Level-triggered: ``set`` (never blocks) wakes the owner's next or current ``wait``;
    the owner ``clear``s it before it looks at its work again."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def clear(self) -> None:
        if self._event.is_set():
            self._event = trio.Event()

    async def wait(self) -> None:
        await self._event.wait()


class ThreadWakeup:
    """A ``Wakeup`` whose ``set`` any thread may call (it never blocks): it reaches the
    loop of the owner's last ``wait`` (TrioToken.run_sync_soon); a set before the owner
    first waits, or while its loop is gone, is kept for its next ``wait``. Sets between
    two ``clear``s wake the owner once."""

    def __init__(self) -> None:
        self._wakeup = Wakeup()
        self._lock = threading.Lock()
        self._pending = False  # set since the owner's last clear
        self._token: trio.lowlevel.TrioToken | None = None  # the owner's loop, once it waited

    def set(self) -> None:
        with self._lock:
            if self._pending:  # the owner is woken already (or will see it when it waits)
                return
            self._pending = True
            token = self._token
        if token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._wakeup.set)

    def is_set(self) -> bool:
        return self._pending

    def clear(self) -> None:
        """Trio thread (the owner's)."""
        with self._lock:
            self._pending = False
        self._wakeup.clear()

    async def wait(self) -> None:
        with self._lock:
            self._token = trio.lowlevel.current_trio_token()
            if self._pending:
                self._wakeup.set()
        await self._wakeup.wait()
