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

from ..catalog import Catalog, CheckpointRow, CheckpointState
from ..catalog.catalog import Backlog
from ..catalog.protocols import MetaCatalog, NamespaceCatalog, QuotaCatalog, ReplicaCatalog
from ..checkpoints.reach import Reach
from ..checkpoints.retention import run_of
from ..checkpoints.summary import summarize
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
from .sync import backlog_line
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


def _checkpoint_runs(catalog: Catalog, mnt: Path | None, live: dict[str, Any] | None,
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
        "app": (stats or {}).get("app"),
        "memory": (stats or {}).get("memory"),
        "residency": (stats or {}).get("residency"),
        "metrics": metrics,
        "metrics_requested": (stats or {}).get("metrics_requested"),
        "metrics_url": f"http://{metrics}/metrics" if metrics else None,
    }


class TierFactsCatalog(ReplicaCatalog, MetaCatalog, Protocol):
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


def _namespaces(catalog: QuotaCatalog, viewer: Viewer) -> list[dict[str, Any]]:
    """Each namespace's committed usage and quota, as the catalog counts them (quota: as
    the last mount declaring the namespace configured it); only those ``viewer`` may see."""
    return [{
        "path": u.ns, "used_bytes": u.bytes, "files": u.files, "quota_bytes": u.quota,
        "percent": None if not u.quota else round(100 * u.bytes / u.quota, 1),
    } for u in catalog.namespace_usage() if viewer.may_see(u.ns)]


def service_line(x: dict[str, Any]) -> str:
    """A background service that failed unexpectedly: contained and restarted."""
    ago = time.time() - x["last_error_at"]
    return (f"service {x['name']}: {x['state']}, {x['errors']} unexpected error(s), "
            f"last {_secs(ago)} ago: {x['last_error']}")


def namespace_line(n: dict[str, Any]) -> str:
    text = f"namespace {n['path']}: {_size(n['used_bytes'])} used"
    if n["quota_bytes"] is None:
        text += " (no quota)"
    else:
        pct = "" if n["percent"] is None else f" ({n['percent']:.0f}%)"
        text += f" of {_size(n['quota_bytes'])} quota{pct}"
    return text + f", {n['files']} file(s)"


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


def _health_text(t: dict[str, Any]) -> str:
    """What a failing tier's line adds: the last error, its age, the streak, the retry."""
    if t["state"] in ("healthy", "unknown", "unused", "degraded") or not t["last_error"]:
        return ""
    text = f"; last error {_secs(t['last_error_age_s'])} ago"
    if t["consecutive_failures"]:
        text += f" ({t['consecutive_failures']} consecutive failures)"
    text += f": {t['last_error'][:300]}"
    if t["retry_in_s"] is not None:
        text += f"; next upload retry in {_secs(t['retry_in_s'])}"
        if t["backoff_s"] is not None:
            text += f" (backoff {_secs(t['backoff_s'])})"
    if t["fenced"]:
        text += f"; writes held: {t['fenced'][:200]}"
    return text


# -- plain text ------------------------------------------------------------------------------


def _size(n: float | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"


def _secs(s: float | None) -> str:
    if s is None:
        return "?"
    if s < 120:
        return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _capacity_text(c: dict[str, Any] | None) -> str | None:
    if not c or c.get("total") is None:
        return None if not c or c.get("used") is None else f"{_size(c['used'])} stored"
    used = c["total"] - c["free"]
    pct = 100 * used / c["total"] if c["total"] else 0
    text = f"{pct:.0f}% full, {_size(c['free'])} free of {_size(c['total'])}"
    if c.get("used") is not None:
        text += f" ({_size(c['used'])} chunks)"
    return text + (" [capacity cap]" if c.get("capped") else "")


def tier_line(t: dict[str, str], live: dict[str, Any] | None) -> str:
    """One tier in one line: kind and location, and with ``live`` (the daemon's per-tier
    statistics) its state, reads, speed and errors."""
    where = t.get("path") or t.get("url") or ""
    text = f"tier {t['name']}: {t.get('kind', 'local')} {where}"
    if live is None:
        return text
    s = live.get(t["name"])
    if s is None:
        return text
    text += f" - {s['state']}"
    if s.get("degraded_reason"):
        text += f" ({s['degraded_reason']})"
    speed = f"{s['read_mb_s']} MB/s" if s.get("read_mb_s") else "?"
    text += f"; reads {s['reads']} ({s['read_bytes'] / 2**20:.0f} MiB), {speed}, latency {s['latency_ms']} ms"
    if s.get("errors"):
        text += f", {s['errors']} error(s)"
    return text


def plain(s: dict[str, Any]) -> str:
    """The status as plain lines (what a pipe or a log gets)."""
    lines = [f"state dir: {s['state_dir']}"]
    if s["mountpoint"]:
        lines.append(f"mounted at: {s['mountpoint']}")
    running = s["daemon"]["running"]
    lines += _plain_tiers(s, running)
    if running:
        lines.append("read order (fastest valid copy first, measured): " + " > ".join(s["read_order"]))
        if s["counters"]:
            lines.append("counters: " + ", ".join(f"{k} {v}" for k, v in s["counters"].items()))
        lines += [service_line(x) for x in s["services"]]
        if s.get("residency"):
            lines.append(residency_text(s["residency"]))
    else:
        lines.append("daemon: not running (no live statistics)")
    lines += _plain_backlog(s, running)
    lines.append(deletions_text(s["deletions"]))
    lines.extend(namespace_line(n) for n in s["namespaces"])
    for run in s["runs"]:
        items = []
        for c in run["latest"]:
            step = "" if c["step"] is None else f", step {c['step']}"
            items.append(f"{c['root']} ({c['state']}{step}, {_size(c['logical_bytes'])})")
        lines.append(f"checkpoints in {run['run']}: " + "; ".join(items))
        if run["remote_durable"]:
            lines.append(f"  newest durable on the remote: {run['remote_durable']['root']}")
    if s["metrics"]:
        moved = s.get("metrics_requested")
        lines.append(f"metrics: {s['metrics_url']}" + (
            f" ({moved} was taken)" if moved and moved != s["metrics"]
            and not moved.endswith(":0") else ""))
    elif running:
        lines.append("metrics: off")
    return "\n".join(lines)


def _plain_tiers(s: dict[str, Any], running: bool) -> list[str]:
    """One line per tier: where, its health (with a daemon), capacity, what it stores."""
    lines = []
    live = {t["name"]: t for t in s["tiers"] if t["state"] not in ("unknown", "unused")}
    for t in s["tiers"]:
        rec = {"name": t["name"], "kind": t["kind"]}
        rec["url" if t["kind"] != "local" else "path"] = t["location"] or ""
        text = tier_line(rec, live if running else None)
        if running:
            text += _health_text(t)
        cap = _capacity_text(t["capacity"]) if t["kind"] == "local" else None
        if cap:
            text += f"; capacity {cap}"
        # What the catalog records there (a remote has no capacity to show but this).
        text += f"; {t['stored_chunks']} chunk(s), {_size(t['stored_bytes'])} stored"
        if t.get("shares_device_with"):
            text += f"; shares its device with {', '.join(t['shares_device_with'])}"
        lines.append(text)
    return lines


def _plain_backlog(s: dict[str, Any], running: bool) -> list[str]:
    """The upload backlog, its rate, and the files only this node's tiers hold."""
    b = s["backlog"]
    if b is None:
        return ["backlog: none (no remote tier configured; data is on the local tiers only)"]
    lines = []
    oldest = None if b["oldest_age_s"] is None else time.time_ns() - int(b["oldest_age_s"] * 1e9)
    rate = b["last_upload_rate"]
    live_rate = b["upload_rate_bytes_s"]
    lines.append(backlog_line(
        Backlog(b["chunks"], b["bytes"], oldest, b["blocked"], b["last_error"]),
        None if b["eta_s"] is None or not live_rate else (live_rate, 0.0),
    ))
    if b["remote_failing"]:
        lines.append("uploads: remote tier(s) " + ", ".join(b["remote_failing"])
                     + " failing; no estimate until uploads succeed again")
    elif running and live_rate is not None:
        lines.append(f"upload rate now: {live_rate / 1e6:.1f} MB/s")
    if rate is not None and not running:
        lines.append(f"last measured upload rate: {rate['bytes_s'] / 1e6:.1f} MB/s "
                     f"({rate['age_s']:.0f} s ago)")
    for r in s.get("at_risk") or ():
        who = "this node's local tiers" if r["node"] is None else f"node {r['node']}"
        more = "" if r["files"] <= len(r["paths"]) else ", ..."
        lines.append(f"at risk: {r['files']} file(s) only on {who} (not on the remote yet): "
                     + ", ".join(r["paths"]) + more)
    return lines


def deletions_text(queues: list[dict[str, Any]]) -> str:
    """One line: the deletion queue per tier (frames of deleted, evicted or expired data)."""
    if not queues:
        return "deletion queue: empty"
    parts = []
    for q in queues:
        text = (f"{q['tier']} {q['chunks']} chunk(s), {_size(q['bytes'])}, "
                f"oldest {_secs(q['oldest_age_s'])}")
        if q["failing"]:
            text += f", {q['failing']} retrying (last error: {(q['last_error'] or '?')[:200]})"
        parts.append(text)
    return "deletion queue: " + "; ".join(parts)


# -- rich --------------------------------------------------------------------------------------


AT_RISK_SAMPLE = 5


class AtRiskCatalog(ReplicaCatalog, NamespaceCatalog, Protocol):
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


def render(s: dict[str, Any]) -> Any:
    """The status as a rich renderable (one screen)."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.text import Text

    parts: list[Any] = [_rich_head(s), _rich_tiers(s),
                        Panel(_rich_backlog(s), title="upload backlog", title_align="left")]
    dq = deletions_text(s["deletions"])
    parts.append(Text(dq, style="yellow" if any(q["failing"] for q in s["deletions"]) else ""))
    for n in s["namespaces"]:
        full = n["percent"] is not None and n["percent"] >= 90
        parts.append(Text(namespace_line(n), style="bold red" if full else ""))
    parts.append(_rich_checkpoints(s) if s["runs"] else Text("no checkpoints yet", style="dim"))
    if s.get("residency"):
        parts.append(Text(residency_text(s["residency"])))
    for x in s["services"]:
        parts.append(Text(service_line(x),
                          style="bold red" if x["state"] == "degraded" else "yellow"))
    if s["counters"]:
        counters = Text("counters: ", style="bold")
        for k, v in s["counters"].items():
            bad = v and k in ("integrity_failures", "missing_copies", "heal_failures",
                              "unreadable_copies")
            counters.append(f"{k} {v}  ", style="bold red" if bad else "")
        parts.append(counters)
    return Group(*parts)


def _rich_head(s: dict[str, Any]) -> Any:
    """The first line: the mount, the state dir, the daemon, the metrics address."""
    from rich.text import Text

    running = s["daemon"]["running"]
    head = Text()
    head.append("ckptfs ", style="bold")
    head.append(s["mountpoint"] or "(not mounted)", style="bold cyan")
    head.append(f"   state {s['state_dir']}   ")
    if running:
        head.append(f"● daemon pid {s['daemon']['pid']}", style="green")
    else:
        head.append("○ daemon not running", style="yellow")
    head.append("   metrics ")
    head.append(s["metrics_url"] or "off", style="cyan" if s["metrics"] else "dim")
    return head


def _rich_tiers(s: dict[str, Any]) -> Any:
    """One row per tier: health, a capacity bar, reads, speed, location."""
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    tiers = Table(title="tiers", title_justify="left", expand=True, box=None, pad_edge=False)
    for col in ("tier", "kind", "health", "capacity", "", "free", "reads", "MB/s", "ms", "location"):
        tiers.add_column(col, no_wrap=col != "location", overflow="fold")
    for t in s["tiers"]:
        state = t["state"]
        style = {"healthy": "green", "unknown": "dim", "unused": "dim"}.get(state, "bold red")
        health = Text(state, style=style)
        if t["degraded_reason"]:
            health.append(f" {t['degraded_reason'][:40]}", style="red")
        elif state not in ("healthy", "unknown", "unused") and t["last_error"]:
            health.append(f" {_secs(t['last_error_age_s'])} ago: {t['last_error'][:60]}",
                          style="red")
        c = t["capacity"] or {}
        if c.get("total"):
            used = c["total"] - c["free"]
            frac = used / c["total"]
            bar: Any = ProgressBar(total=c["total"], completed=used, width=20,
                                   complete_style="red" if frac > 0.9 else "green")
            pct = f"{100 * frac:.0f}% of {_size(c['total'])}"
            free = _size(c["free"])
        else:
            bar, pct, free = Text(""), f"{_size(t['stored_bytes'])} stored", ""
        reads = "" if t["reads"] is None else f"{t['reads']} ({_size(t['read_bytes'])})"
        tiers.add_row(t["name"], t["kind"], health, bar, pct, free, reads,
                      "" if t["read_mb_s"] is None else str(t["read_mb_s"]),
                      "" if t["latency_ms"] is None else str(t["latency_ms"]),
                      (t["location"] or "") + (
                          f" (device shared with {', '.join(t['shares_device_with'])})"
                          if t.get("shares_device_with") else ""))
    return tiers


def _rich_backlog(s: dict[str, Any]) -> Any:
    """What waits for the remote, how fast it goes, and what blocks it."""
    from rich.text import Text

    b = s["backlog"]
    if b is None:
        backlog = Text("no remote tier: data is on the local tiers only", style="dim")
    elif not b["chunks"]:
        backlog = Text("empty: everything committed is durable on the remote", style="green")
    else:
        backlog = Text(f"{b['chunks']} chunk(s), {_size(b['bytes'])}, oldest {_secs(b['oldest_age_s'])}",
                       style="yellow")
        if b["remote_failing"]:
            backlog.append(f", {', '.join(b['remote_failing'])} failing: no ETA",
                           style="bold red")
        elif b["upload_rate_bytes_s"] and b["eta_s"] is not None:
            backlog.append(f", uploading {b['upload_rate_bytes_s'] / 1e6:.1f} MB/s, "
                           f"ETA {_secs(b['eta_s'])}")
        else:
            backlog.append(", ETA ? (no recent upload)")
        if b["blocked"]:
            backlog.append(f", {b['blocked']} blocked", style="bold red")
        if b["last_error"]:
            backlog.append(f"\nlast error: {b['last_error'][:200]}", style="red")
    return backlog


def _rich_checkpoints(s: dict[str, Any]) -> Any:
    """The latest checkpoints of each run (☁: the newest durable on the remote)."""
    from rich.table import Table
    from rich.text import Text

    ck = Table(title="latest checkpoints", title_justify="left", expand=True, box=None,
               pad_edge=False)
    for col in ("run", "checkpoint", "step", "state", "files", "size", "save", "skew", "durable on"):
        ck.add_column(col, overflow="fold")
    state_style: dict[str, str] = {
        CheckpointState.COMMITTED: "green", CheckpointState.WRITING: "cyan",
        CheckpointState.PARTIAL: "bold red", CheckpointState.EXPIRED: "dim"}
    for run in s["runs"]:
        durable_root = (run["remote_durable"] or {}).get("root")
        for i, c in enumerate(run["latest"]):
            name = Text(c["root"][len(run["run"]):].lstrip("/") or c["root"])
            if c["root"] == durable_root:
                name.append(" ☁", style="cyan")
            ck.add_row(run["run"] if i == 0 else "", name,
                       "" if c["step"] is None else str(c["step"]),
                       Text(c["state"], style=state_style.get(c["state"], "")),
                       str(c["files"]), _size(c["logical_bytes"]),
                       "" if c["write_s"] is None else _secs(c["write_s"]),
                       "" if c["completion_skew_s"] is None else _secs(c["completion_skew_s"]),
                       ",".join(c["durable_on"]) or "-")
    return ck


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


def residency_text(r: dict[str, Any]) -> str:
    """One line: the bound namespaces, copies out of residency, where snapshots go."""
    text = "residency: " + ", ".join(f"{p} in {','.join(locs)}"
                                     for p, locs in r["namespaces"].items())
    out = r.get("copies_out_of_residency") or {}
    text += "; copies out of residency: " + (
        ", ".join(f"{t} {n}" for t, n in out.items()) if out else "none")
    snaps = r.get("snapshot_tiers")
    if snaps is not None:
        text += "; catalog snapshots to " + (", ".join(snaps) if snaps
                                             else "no remote tier (not restorable from a bucket)")
    return text
