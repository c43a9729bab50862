"""What a catalog engine calls back into the daemon: given when the catalog is opened."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CatalogHooks:
    # Called (in the calling thread, after the COMMIT) by every transaction that changed the
    # namespace or file contents: thread-safe, must not block.
    on_touch: Callable[[], None] | None = None
    # Called after an audit record is noted for the flusher: thread-safe, must not block.
    on_audit_note: Callable[[], None] | None = None
    # Called (in the calling thread) by a transaction of a shared catalog that left audit
    # records to be chained (audit.py): the flusher chains them. Thread-safe, no blocking.
    on_audit_pending: Callable[[], None] | None = None
    # This node's name in the audit records.
    node: str = field(default_factory=socket.gethostname)
