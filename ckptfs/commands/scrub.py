"""`ckptfs scrub PATH`: one scrub pass now, through the daemon (docs/operations.md "The
scrubber"): every copy this node scrubs (its local tiers; the remotes while it holds
the remote's lease) read and verified, bad ones healed; prints the pass's report.

The channel is the control xattr ``user.ckptfs.scrub`` on the mount's root, as ``ckptfs
gc`` uses ``user.ckptfs.gc``: the set asks for the pass and returns, the get waits for
it and answers the report (JSON). Root only: a pass reads every tier at the scrub rate.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path
from typing import Any

from . import live
from .progress import progress

XATTR = "user.ckptfs.scrub"


def cmd_scrub(path: Path, as_json: bool) -> int:
    """Exit 0: every bad copy found was healed (or none was found); 1: some were not, or
    the pass could not run."""
    mnt, _state_dir, _inner = live.inside_mount(path)
    try:
        with progress("scrubbing", None):  # a spinner on a terminal
            os.setxattr(str(mnt), XATTR, b"1")
            raw = os.getxattr(str(mnt), XATTR)
    except OSError as exc:
        hint = " (only root may run a scrub)" if exc.errno == errno.EPERM else ""
        print(f"ckptfs scrub: {mnt}: {exc.strerror}{hint}", file=sys.stderr)
        return 1
    report: dict[str, Any] = json.loads(raw)
    if as_json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print(render(report))
    return 1 if report.get("unhealed") or report.get("skipped_tiers") else 0


def render(r: dict[str, Any]) -> str:
    secs = (r.get("finished") or 0) - (r.get("started") or 0)
    lines = [
        f"scrub: {r.get('copies', 0)} copies ({r.get('bytes', 0)} bytes) checked in {secs:.1f} s "
        f"on {', '.join(r.get('tiers') or []) or 'no tier'}",
        f"  bad copies found {r.get('bad', 0)}, healed {r.get('healed', 0)}, "
        f"not healed {r.get('unhealed', 0)}",
    ]
    remote = r.get("remote")
    if remote and not r.get("remote_here"):
        lines.append(f"  remote: scrubbed by node {remote} (it holds the lease)")
    if r.get("skipped_tiers"):
        lines.append(f"  skipped (failing): {', '.join(r['skipped_tiers'])}")
    return "\n".join(lines)
