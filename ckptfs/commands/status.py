"""`ckptfs status [PATH] [--json] [--watch]`: one screen to read at a glance.

The facts come from the catalog (read-only, beside the daemon) and from the running
daemon's ``STATE_DIR/stats.json`` (written each second): tiers with capacity and health,
the upload backlog with an ETA, the latest checkpoints of each run with their state and
the newest one durable on the remote, the counters, and where the metrics are served.

* On a terminal: a rich layout (capacity bars, colours). ``--watch`` redraws it each second
  until Ctrl-C (exit 0).
* Piped: plain lines (stable, for grep and for people reading logs).
* ``--json``: the same facts as one JSON object (docs/operations.md lists the keys);
  with ``--watch``, one object per line each second.

This module gathers the facts and runs the command; statusview.py draws them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from ..catalog import CheckpointRow, CheckpointState
from ..catalog.protocols import (
    MetaCatalog,
    NamespaceCatalog,
    QuotaCatalog,
    ReplicaCatalog,
    UploadQueue,
)
from ..checkpoints.reach import Reach
from ..checkpoints.retention import run_of
from ..checkpoints.summary import RunsCatalog, summarize
from ..errors import CkptfsError, NoDaemon
from ..metrics.address import read_address
from ..statedir import mountpoint_of, read_pid
from .live import (
    daemon_stats,
    mount_of,
    open_catalog,
    remote_tier_names,
    require_daemon,
    resolve_state_dir,
    state_dir_readable,
    upload_rate,
)
from .namespaces import Viewer
from .statusroots import RootsCatalog, root_facts
from .statusview import plain, render
from .userstatus import user_status

LATEST_PER_RUN = 3
WATCH_INTERVAL_S = 1.0


def _local_capacity(path: str | None) -> dict[str, Any] | None:
    """Without a daemon: the device under a local tier (statvfs; a cap is not seen)."""
    if not path:
        return None
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return {"total": st.f_blocks * st.f_frsize, "free": st.f_bavail * st.f_frsize,
            "used": None, "capped": False}


def _shared_devices(tiers: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Local tiers whose directories are on one device (allow_shared_device): the others
    on each one's device."""
    devs: dict[int, list[str]] = {}
    for t in tiers:
        if t.get("kind", "local") == "local" and t.get("path"):
            try:
                devs.setdefault(os.stat(t["path"]).st_dev, []).append(t["name"])
            except OSError:
                continue
    return {n: [o for o in group if o != n] for group in devs.values() if len(group) > 1
            for n in group}


def _checkpoint_runs(catalog: RunsCatalog, mnt: Path | None, live: dict[str, Any] | None,
                     viewer: Viewer) -> list[dict[str, Any]]:
    rows = [r for r in catalog.checkpoint_rows("/")
            if r.state is not CheckpointState.DELETED and viewer.may_see(r.root)]
    runs: dict[str, list[CheckpointRow]] = {}
    for r in rows:
        runs.setdefault(run_of(r.root), []).append(r)
    durable = (live or {}).get("remote_durable") or {}
    reach = Reach.of(catalog)  # once: every node's writers and live nodes
    out = []
    for run in sorted(runs):
        newest = sorted(runs[run], key=lambda r: r.id, reverse=True)[:LATEST_PER_RUN]
        latest = []
        for r in newest:
            info = asdict(summarize(catalog, mnt or Path(""), r, reach))
            info["path"] = (str(mnt) + info["root"]) if mnt else None
            info["begin_ns"], info["commit_ns"] = r.begin_ns, r.commit_ns
            latest.append(info)
        out.append({"run": run, "checkpoints": len(runs[run]), "latest": latest,
                    "remote_durable": durable.get(run)})
    return out


def status_facts(state_dir: Path) -> dict[str, Any]:
    """Every fact `ckptfs status` shows, as plain data (the ``--json`` output)."""
    catalog = open_catalog(state_dir)
    try:
        viewer = Viewer.of(catalog)  # runs and paths of the namespaces this user may reach
        stats = daemon_stats(state_dir)
        mountpoint = (stats or {}).get("mountpoint") or mountpoint_of(state_dir)
        tiers = _tier_facts(catalog, stats)
        remotes = remote_tier_names(catalog)
        backlog = _backlog_facts(catalog, remotes, tiers, stats) if remotes else None
        deletions = [{
            "tier": q.tier, "chunks": q.chunks, "bytes": q.bytes, "failing": q.failing,
            "oldest_age_s": None if q.oldest_enqueued_ns is None
            else max(0.0, (time.time_ns() - q.oldest_enqueued_ns) / 1e9),
            "last_error": q.last_error,
        } for q in catalog.deletion_backlog()]
        runs = _checkpoint_runs(catalog, Path(mountpoint) if mountpoint else None, stats, viewer)
        at_risk = _at_risk(catalog, viewer) if remotes else []
        namespaces = _namespaces(catalog, viewer)
        drills = [r.as_json() for r in catalog.last_drills() if viewer.may_see(r.run)]
    finally:
        catalog.close()
    metrics = None
    if stats is not None:
        metrics = stats.get("metrics") or read_address(state_dir)
    return {
        "state_dir": str(state_dir),
        "mountpoint": mountpoint,
        "daemon": {
            "running": stats is not None,
            "pid": read_pid(state_dir) if stats is not None else None,
            "stats_age_s": None if stats is None else round(time.time() - stats["time"], 1),
        },
        "tiers": tiers,
        "read_order": (stats or {}).get("read_order_16mib", []),
        "counters": (stats or {}).get("counters", {}),
        # Background services that met an unexpected error (ckptfs/supervise.py).
        "services": (stats or {}).get("services", []),
        "backlog": backlog,
        "at_risk": at_risk,
        "deletions": deletions,
        "namespaces": namespaces,
        "checkpoint_states": (stats or {}).get("checkpoint_states"),
        "runs": runs,
        "drills": drills,  # the newest restore drill of each run (catalog/drills.py)
        "app": (stats or {}).get("app"),
        "memory": (stats or {}).get("memory"),
        "residency": (stats or {}).get("residency"),
        "scrub": (stats or {}).get("scrub"),  # the scrubber's progress (scrub/progress.py)
        "metrics": metrics,
        "metrics_requested": (stats or {}).get("metrics_requested"),
        "metrics_url": f"http://{metrics}/metrics" if metrics else None,
    }


class TierFactsCatalog(ReplicaCatalog, UploadQueue, MetaCatalog, Protocol):
    """The recorded tiers, what each stores, the upload backlog and its last rate."""


def _tier_facts(catalog: TierFactsCatalog, stats: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Each recorded tier: what the catalog stores there, and with a daemon its state,
    capacity, traffic and health."""
    per_tier = {} if stats is None else {t["name"]: t for t in stats.get("tiers", [])}
    tiers = []
    stored = catalog.stored_by_tier()  # what the catalog records, not what a daemon saw
    now = time.time()
    shared = _shared_devices(catalog.recorded_tiers())
    for t in catalog.recorded_tiers():
        s = per_tier.get(t["name"], {})
        kind = t.get("kind", "local")
        capacity = s.get("capacity")
        if capacity is None and kind == "local":
            capacity = _local_capacity(t.get("path"))
        chunks, nbytes = stored.get(t["name"], (0, 0))
        if kind != "local":
            # A remote's tier object only counts the objects it put or listed (none on
            # a node restored from the bucket): the catalog's replica rows say more.
            capacity = {"total": None, "free": None, "capped": False, **(capacity or {}),
                        "used": nbytes}
        tiers.append({
            "name": t["name"], "kind": kind, "location": t.get("path") or t.get("url"),
            "state": s.get("state", "unknown" if stats is None else "unused"),
            "degraded_reason": s.get("degraded_reason"),
            "capacity": capacity,
            "reads": s.get("reads"), "read_bytes": s.get("read_bytes"),
            "read_mb_s": s.get("read_mb_s"), "latency_ms": s.get("latency_ms"),
            "writes": s.get("writes"), "write_bytes": s.get("write_bytes"),
            "errors": s.get("errors"),
            "stored_chunks": chunks, "stored_bytes": nbytes,
            **_tier_health(s, now),
            "shares_device_with": shared.get(t["name"], []) if kind == "local" else None,
        })
    return tiers


def _backlog_facts(catalog: TierFactsCatalog, remotes: list[str], tiers: list[dict[str, Any]],
                   stats: dict[str, Any] | None) -> dict[str, Any]:
    """The upload backlog to the remote tiers: its size and age, the rates, the ETA."""
    b = catalog.backlog()
    rate = upload_rate(catalog)
    live_backlog = (stats or {}).get("backlog") or {}
    # The daemon's own measure over its last seconds (0 when nothing went up); without
    # a daemon nothing uploads: no rate, no ETA.
    fresh = None if stats is None else live_backlog.get("upload_rate_bytes_s")
    failing = [t["name"] for t in tiers if t["kind"] != "local"
               and t["state"] not in ("healthy", "unknown", "unused")]
    return {
        "remote_tiers": remotes, "chunks": b.chunks, "bytes": b.bytes,
        "oldest_age_s": None if b.oldest_enqueued_ns is None
        else max(0.0, (time.time_ns() - b.oldest_enqueued_ns) / 1e9),
        "blocked": b.blocked, "last_error": b.last_error,
        "upload_rate_bytes_s": fresh,
        "last_upload_rate": None if rate is None
        else {"bytes_s": rate[0], "age_s": rate[1]},
        "eta_s": 0.0 if not b.bytes else (
            b.bytes / fresh if fresh and not failing else None),
        "remote_failing": failing,
    }


class NamespacesCatalog(QuotaCatalog, RootsCatalog, Protocol):
    """The namespaces' usage and their roots."""


def _namespaces(catalog: NamespacesCatalog, viewer: Viewer) -> list[dict[str, Any]]:
    """Each namespace's committed usage and quota, as the catalog counts them (quota: as
    the last mount declaring the namespace configured it), and its root (statusroots.py);
    only those ``viewer`` may see."""
    roots = root_facts(catalog)
    return [{
        "path": u.ns, "used_bytes": u.bytes, "files": u.files, "quota_bytes": u.quota,
        "percent": None if not u.quota else round(100 * u.bytes / u.quota, 1),
        "root": roots.get(u.ns),
    } for u in catalog.namespace_usage() if viewer.may_see(u.ns)]


def _tier_health(s: dict[str, Any], now: float) -> dict[str, Any]:
    """The health facts of one tier from the daemon's statistics (None without them)."""
    at, retry = s.get("last_error_at"), s.get("retry_at")
    return {
        "last_error": s.get("last_error"), "last_error_at": at,
        "last_error_age_s": None if at is None else round(max(0.0, now - at), 1),
        "consecutive_failures": s.get("consecutive_failures"),
        "backoff_s": s.get("backoff_s"),
        "retry_in_s": None if retry is None else round(max(0.0, retry - now), 1),
        "fenced": s.get("fenced"),
    }


AT_RISK_SAMPLE = 5


class AtRiskCatalog(UploadQueue, NamespaceCatalog, Protocol):
    """The files not durable yet, by tier, and their paths."""


def _at_risk(catalog: AtRiskCatalog, viewer: Viewer) -> list[dict[str, Any]]:
    """Files whose chunks are not on the remote yet, by the node holding them (a shared
    catalog names its local tiers NODE:NAME; the embedded catalog's are this node's, node
    None): what losing that node would lose."""
    by_node: dict[str | None, set[int]] = {}
    for tier, inos in catalog.not_durable_files().items():
        by_node.setdefault(tier.split(":", 1)[0] if ":" in tier else None, set()).update(inos)
    out = []
    for node, inos in sorted(by_node.items(), key=lambda kv: kv[0] or ""):
        paths = []
        for ino in sorted(inos)[:AT_RISK_SAMPLE]:
            with contextlib.suppress(CkptfsError):  # removed meanwhile
                path = catalog.path_of(ino)
                if viewer.may_see(path):
                    paths.append(path)
        out.append({"node": node, "files": len(inos), "paths": paths})
    return out


def cmd_status(path: Path | None, state_dir: str | None, *, as_json: bool = False,
               watch: bool = False) -> int:
    sd = resolve_state_dir(path, state_dir)
    found = None if path is None else mount_of(path)
    private = found is not None and not state_dir_readable(sd)
    try:
        # A mount whose daemon was killed: the catalog still shows what it left (backlog,
        # files at risk), then the status says that no daemon serves it, and exits 1.
        require_daemon(None if found is None else found[0], sd)
        dead = None
    except NoDaemon as exc:
        if private:  # this user sees the status only through the daemon
            raise
        dead = exc
    code = _show(path, sd, found, private, as_json=as_json, watch=watch)
    if dead is not None and not watch:
        print(f"ckptfs status: {dead}", file=sys.stderr)
        return 1
    return code


def _show(path: Path | None, sd: Path, found: tuple[Path, Path] | None, private: bool, *,
          as_json: bool, watch: bool) -> int:
    if not private:
        open_catalog(sd).close()  # fail early (exit 1) if there is no catalog
    if watch:
        # Ctrl-C is the only way out of --watch: a shell that started us in the background
        # (nohup, `cmd &` without job control) hands us SIGINT ignored, and Python then
        # installs no KeyboardInterrupt handler; take it back.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if found is not None and private:
        # Not the daemon's user: what the daemon shows this user through the mount.
        mnt = found[0]
        return _loop(lambda: print(user_status(mnt, sd, as_json), flush=True), watch)
    if as_json:
        return _loop(lambda: print(json.dumps(status_facts(sd), indent=None if watch else 1),
                                   flush=True), watch)
    if not sys.stdout.isatty():
        first = [True]

        def show() -> None:
            if not first[0]:
                print()
            first[0] = False
            print(plain(status_facts(sd)), flush=True)

        return _loop(show, watch)
    from rich.console import Console

    console = Console()
    if not watch:
        console.print(render(status_facts(sd)))
        return 0
    from rich.live import Live

    try:
        with Live(render(status_facts(sd)), console=console, auto_refresh=False,
                  screen=False) as live:
            while True:
                time.sleep(WATCH_INTERVAL_S)  # the refresh period itself, not a wait for a condition
                live.update(render(status_facts(sd)), refresh=True)
    except KeyboardInterrupt:
        return 0


def _loop(show: Any, watch: bool) -> int:
    try:
        while True:
            try:
                show()
            except CkptfsError as exc:
                if not watch:
                    raise
                print(f"ckptfs status: {exc}", file=sys.stderr)
            if not watch:
                return 0
            time.sleep(WATCH_INTERVAL_S)  # the refresh period of --watch
    except KeyboardInterrupt:
        return 0


