"""A wake-up shared by the task that waits and the parts that poke it.

The composition root (mount.py) creates one before either side, so a component built
earlier can be handed ``wakeup.set`` for a component built later: nothing is wired after
construction. Trio thread only.
"""

from __future__ import annotations

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
