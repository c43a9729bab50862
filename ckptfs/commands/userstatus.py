"""`ckptfs status PATH` for a user who cannot read the state dir (private to the daemon's
user): what the daemon shows that user through the mount. The checkpoints of the
namespaces the user may reach (``user.ckptfs.checkpoints``, vfs/listing.py) and the
mount's free space; tiers, backlog and counters stay with the daemon's user and root."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..catalog import CheckpointState
from ..checkpoints.retention import run_of
from .namespaces import listed

LATEST_PER_RUN = 3


def user_facts(mnt: Path, state_dir: Path) -> dict[str, Any]:
    infos = [i for i in listed(mnt, "/") if i["state"] != CheckpointState.DELETED.value]
    runs: dict[str, list[dict[str, Any]]] = {}
    for i in infos:
        runs.setdefault(run_of(i["root"]), []).append(i)
    st = os.statvfs(mnt)
    return {
        "state_dir": str(state_dir), "mountpoint": str(mnt), "private": True,
        "space": {"total": st.f_blocks * st.f_frsize, "free": st.f_bavail * st.f_frsize},
        "runs": [{"run": run, "checkpoints": len(rows),
                  "latest": sorted(rows, key=lambda r: r["id"], reverse=True)[:LATEST_PER_RUN]}
                 for run, rows in sorted(runs.items())],
    }


def user_status(mnt: Path, state_dir: Path, as_json: bool) -> str:
    facts = user_facts(mnt, state_dir)
    if as_json:
        return json.dumps(facts, indent=1)
    space = facts["space"]
    lines = [f"mounted at: {mnt}",
             f"state dir: {state_dir} (private to the daemon's user: tiers, uploads and "
             "counters are shown to it and to root)",
             f"space: {space['free'] / 2**30:.1f} GiB free of {space['total'] / 2**30:.1f} GiB"]
    for run in facts["runs"]:
        items = []
        for c in run["latest"]:
            step = "" if c["step"] is None else f", step {c['step']}"
            items.append(f"{c['root']} ({c['state']}{step}, {c['logical_bytes'] / 2**20:.1f} MiB)")
        lines.append(f"checkpoints in {run['run']}: " + "; ".join(items))
    if not facts["runs"]:
        lines.append("no checkpoints you may see")
    return "\n".join(lines)
