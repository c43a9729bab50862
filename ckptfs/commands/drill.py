"""`ckptfs drill [RUN_DIR...]`: restore drills, run by the daemon of the mount.

The command asks through a control xattr, like `ckptfs gc`: ``setxattr
user.ckptfs.drill`` on the run directory asks for a drill (the owner of the directory or
root; ``{"as": [UID, GID]}`` for root's ``--as``), and ``getxattr`` of it waits for the
report. The daemon runs it (drill/service.py), since a drill must read as a new node
would: the remote tier alone, each chunk verified, with the namespace's key and access
rules, the keys and the tiers being the daemon's. Without RUN_DIR: the config's ``[drill]
runs`` in the mount of its state dir (what the systemd timer runs).

Exit 0: every drill passed; 1: one failed (a WARNING line each on stderr) or could not be
asked; 2: a bad command line or config.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from ..config import load_config
from ..errors import NoDaemon, UsageError
from ..statedir import mountpoint_of
from . import live

XATTR_DRILL = "user.ckptfs.drill"


def parse_as(text: str | None) -> tuple[int, int] | None:
    """``--as UID[:GID]`` (GID: the same number as UID when left out)."""
    if text is None:
        return None
    uid, _, gid = text.partition(":")
    try:
        ids = int(uid), int(gid or uid)
    except ValueError:
        raise UsageError(f"--as: expected UID[:GID], got {text!r}") from None
    if min(ids) < 0:
        raise UsageError(f"--as: expected UID[:GID], got {text!r}")
    return ids


def configured_runs(config: str | None, state_dir: str | None) -> list[Path]:
    """The ``[drill] runs`` of the config, as paths in the mount of its state dir."""
    cfg = load_config(config, state_dir=state_dir)
    if not cfg.drill.runs:
        raise UsageError("give RUN_DIR, or list run directories in the config's [drill] runs")
    mnt = mountpoint_of(cfg.state_dir)
    if mnt is None:
        raise NoDaemon(f"state dir {cfg.state_dir} is not mounted")
    return [Path(mnt + run) for run in cfg.drill.runs]


def ask(path: Path, who: tuple[int, int] | None) -> dict[str, Any]:
    """One drill of ``path`` through its mount: the daemon's report. A user asks on the
    run directory (its owner); root on the mount's root, naming the run (a namespace's
    directories need not let root in)."""
    mnt, _, inner = live.inside_mount(path)  # a live ckptfs mount, or InvalidArgument
    req: dict[str, Any] = {} if who is None else {"as": list(who)}
    where = path
    if os.geteuid() == 0:
        req["run"], where = inner, mnt
    os.setxattr(where, XATTR_DRILL, json.dumps(req).encode())
    return dict(json.loads(os.getxattr(where, XATTR_DRILL)))


def _line(path: Path, r: dict[str, Any]) -> str:
    implied = r.get("implied_restore_s")
    whole = "" if implied is None else f"; whole checkpoint ~{implied:.1f} s"
    return (f"ckptfs drill: {path}: {r['result']}: {r.get('checkpoint') or '-'} "
            f"({r.get('framework') or '?'}), {r.get('files', 0)} file(s), "
            f"{r.get('bytes', 0) / 2**20:.1f} MiB from the remote in "
            f"{r.get('duration_s', 0.0):.2f} s ({r.get('mb_per_s', 0.0):.1f} MB/s{whole}), "
            f"as uid {r['as'][0]} gid {r['as'][1]}")


def cmd_drill(paths: list[Path], as_ids: str | None, config: str | None,
              state_dir: str | None, as_json: bool) -> int:
    who = parse_as(as_ids)
    targets = paths or configured_runs(config, state_dir)
    failed = 0
    reports = []
    for path in targets:
        try:
            r = ask(path, who)
        except OSError as exc:
            failed += 1
            print(f"ckptfs drill: WARNING: drill of {path} could not run: "
                  f"{exc.strerror or exc}", file=sys.stderr)
            reports.append({"run": str(path), "result": "failed", "problems": [str(exc)]})
            continue
        reports.append(r)
        if not as_json:
            print(_line(path, r))
        if r.get("result") != "passed":
            failed += 1
            probs = r.get("problems") or ["(no problem reported)"]
            print(f"ckptfs drill: WARNING: restore drill of {path} FAILED: {probs[0]}",
                  file=sys.stderr)
            for p in probs[1:]:
                print(f"  also: {p}", file=sys.stderr)
    if as_json:
        print(json.dumps(reports, indent=2, sort_keys=True))
    return 1 if failed else 0
