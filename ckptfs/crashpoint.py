"""Named crash points for the crash-point tests (tests/faults/test_commit_crash.py).

``CKPTFS_TEST_CRASH_AT=STEP:TEXT`` makes the daemon kill itself with SIGKILL when it
reaches the step named STEP for a path that ends with TEXT: a ``kill -9`` at exactly that
instant of the commit protocol (docs/semantics.md, "The commit protocol"). Unset (always,
outside those tests) a crash point costs one comparison.

Steps:

* ``close-committed``: a close's commit transaction has committed; the reply to the
  application is not sent yet.
* ``rename-committed``: a rename's transaction has committed; not replied yet.
* ``tracker-received``: the checkpoint tracker received the event of a close or rename
  (the application's call has returned); nothing of it is recorded yet.
* ``tracker-recorded``: the tracker recorded what the event detected; the replay point
  has not moved past it yet.
"""

from __future__ import annotations

import os
import signal

STEPS = ("close-committed", "rename-committed", "tracker-received", "tracker-recorded")


def _armed() -> tuple[str, str] | None:
    spec = os.environ.get("CKPTFS_TEST_CRASH_AT")
    if not spec:
        return None
    step, _, text = spec.partition(":")
    if step not in STEPS:
        raise SystemExit(f"CKPTFS_TEST_CRASH_AT: unknown step {step!r} (one of {', '.join(STEPS)})")
    return step, text


_ARMED = _armed()
ARMED = _ARMED is not None  # callers that must work out the path first check this


def reached(step: str, path: str) -> None:
    """The daemon is at ``step`` for ``path``: die there if a test asked for it."""
    if _ARMED is not None and _ARMED[0] == step and path.endswith(_ARMED[1]):
        os.kill(os.getpid(), signal.SIGKILL)
