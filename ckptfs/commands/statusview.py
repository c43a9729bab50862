"""How `ckptfs status` draws its facts (status.py gathers them): plain lines for a pipe
or a log, a rich screen for a terminal (rich is imported only to draw one)."""

from __future__ import annotations

import time
from typing import Any

from ..catalog import CheckpointState
from ..catalog.catalog import Backlog
from .scrubview import scrub_lines
from .statusroots import root_text
from .sync import backlog_line


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
    return text + f", {n['files']} file(s)" + root_text(n.get("root"))


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


def drill_line(d: dict[str, Any]) -> str:
    """The newest restore drill of a run (docs/operations.md "Restore drills")."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(d["started_ns"] / 1e9))
    implied = d["implied_restore_s"]
    text = (f"drill of {d['run']}: {d['result'].upper()} at {when}: "
            f"{d['checkpoint'] or '-'}, {_size(d['bytes'])} in {_secs(d['duration_s'])} "
            f"({d['mb_per_s']:.1f} MB/s; whole checkpoint {_secs(implied)})")
    return text + (f"; first problem: {d['problem']}" if d["problem"] else "")


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
        lines += scrub_lines(s.get("scrub"))
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
    lines.extend(drill_line(d) for d in s.get("drills", []))
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
    for d in s.get("drills", []):
        parts.append(Text(drill_line(d), style="" if d["result"] == "passed" else "bold red"))
    if s.get("residency"):
        parts.append(Text(residency_text(s["residency"])))
    parts.extend(Text(line) for line in scrub_lines(s.get("scrub")))
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
