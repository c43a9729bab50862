"""The facts a running daemon gathers about itself, for `ckptfs status` and ``/metrics``.

* ``Telemetry`` gathers, once a second from the daemon's stats loop, what needs the catalog
  or a statvfs: capacity per tier, the upload backlog, checkpoint states, the newest
  checkpoint per run and the newest one durable on the remote, save durations and skews.
  It keeps them in a snapshot (also merged into ``STATE_DIR/stats.json``).
* ``FsCollector`` turns that snapshot and the thread-safe live counters (``ckptfs.stats``)
  into metrics at scrape time. The scrape runs in the exporter's HTTP thread
  (metrics/exporter.py): it never touches the SQLite connection.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import trio
from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import __version__
from ..catalog import CheckpointRow, CheckpointState
from ..catalog.durability import checkpoint_durable
from ..catalog.protocols import (
    CheckpointCatalog,
    DeletionQueue,
    QuotaCatalog,
    ReplicaCatalog,
    UploadQueue,
)
from ..checkpoints.retention import run_of
from ..checkpoints.summary import SummaryCatalog, summarize
from ..chunks.residency import Residency
from ..errors import CkptfsError
from ..names import readable
from ..tiers.health import FAILING, HEALTHY, Health
from .exporter import REGISTRY, Endpoint
from .requests import APP
from .scrubbing import scrub_metrics

if TYPE_CHECKING:
    from ..stats import Stats
    from ..tiers.base import Tier

log = logging.getLogger("ckptfs.metrics")

STATS_INTERVAL_S = 1.0  # how often the live statistics are gathered and written
UPLOAD_RATE_WINDOW_S = 10.0  # the upload rate status shows: bytes uploaded over this window
SAVE_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 3600)

CHECKPOINT_SAVE_SECONDS = Histogram(
    "ckptfs_checkpoint_save_seconds",
    "Checkpoint save duration, first write to commit, of checkpoints committed since start",
    buckets=SAVE_BUCKETS, registry=REGISTRY,
)
CHECKPOINT_SKEW_SECONDS = Histogram(
    "ckptfs_checkpoint_completion_skew_seconds",
    "Per-file completion skew of a checkpoint: last minus first file completed",
    buckets=SAVE_BUCKETS, registry=REGISTRY,
)


# Counters of ckptfs.stats exported under their own names (others: ckptfs_events_total).
_COUNTERS = {
    "integrity_failures": "Chunk copies found corrupt by a read (served from another copy)",
    "missing_copies": "Chunk copies found missing by a read",
    "heals": "Bad or missing chunk copies repaired",
    "heal_failures": "Repairs of bad chunk copies that failed",
    "copy_backs": "Chunks read from a remote tier only and copied to a local tier",
    "chunks_deleted": "Chunks deleted because nothing references them any more",
    "deletions": "Chunk frames deleted from a tier by the deletion queue",
    "deletion_failures": "Attempts of the deletion queue that failed (retried with backoff)",
}


class TelemetryStore(Protocol):
    """What telemetry reads of the chunk store (chunks/store.py)."""

    stats: Stats
    tiers: dict[str, Tier]
    remotes: list[Tier]
    evicted_bytes: int
    residency: Residency  # what is bound, the copies out of residency found at mount

    @property
    def waiting_for_room(self) -> int: ...


class UploadCounter(Protocol):
    uploaded_bytes: int


class BudgetGauge(Protocol):
    used: int
    limit: int


class TelemetryCatalog(
    SummaryCatalog, ReplicaCatalog, UploadQueue, DeletionQueue, QuotaCatalog, CheckpointCatalog, Protocol,
):
    """What the statistics read: the backlogs, the namespaces' usage, the checkpoints
    (their summaries and durability)."""


class Telemetry:
    """Facts refreshed once a second by the daemon's stats loop (``refresh``), kept in
    ``facts`` (a dict replaced whole: the scrape thread reads it without a lock)."""

    DURABLE_CHECK_S = 5.0  # how often the newest remote-durable checkpoint is looked for

    def __init__(
        self, catalog: TelemetryCatalog, db_limiter: trio.CapacityLimiter, store: TelemetryStore,
        uploader: UploadCounter, budget: BudgetGauge, mountpoint: str | None = None,
        endpoint: Endpoint | None = None, scrub: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        """``scrub``: the scrubber's progress (scrub/service.py ``snapshot``; None: none)."""
        self.catalog = catalog
        self.db_limiter = db_limiter
        self.store = store
        self.uploader = uploader
        self.budget = budget
        self.facts: dict[str, Any] = {}
        self.mountpoint = mountpoint
        self.endpoint = endpoint or Endpoint()  # where the exporter serves the metrics
        self.scrub = scrub
        self._seen: dict[int, int | None] = {}  # checkpoint id -> commit_ns already observed
        self._primed = False  # checkpoints committed before this daemon started: not observed
        self._durable: set[tuple[str, int]] = set()  # (root, commit_ns) known durable remotely
        self._remote_durable: dict[str, dict[str, Any]] = {}
        self._durable_checked = -math.inf
        self._rate_mark: tuple[float, float, float] | None = None
        self._rates = (0.0, 0.0)
        self._failing = False
        self._uploaded: deque[tuple[float, int]] = deque()  # (monotonic, uploaded bytes)

    async def publish(self, path: Path) -> None:
        """Write the live statistics for `ckptfs status` about once a second."""
        stats = self.store.stats
        while True:
            stats.counters["evicted_bytes"] = self.store.evicted_bytes
            stats.counters["uploaded_bytes"] = self.uploader.uploaded_bytes
            await self.refresh()
            try:
                await trio.to_thread.run_sync(stats.write, path)
            except OSError as exc:
                log.warning("could not write %s: %s", path, exc)
            await trio.sleep(STATS_INTERVAL_S)

    async def refresh(self) -> None:
        """Gather the facts (statvfs in a thread, catalog under the db limiter) and publish
        them into the stats snapshot. Errors are logged once, never raised."""
        try:
            capacity = await trio.to_thread.run_sync(self._capacity)
            catalog_facts = await trio.to_thread.run_sync(self._catalog_facts, limiter=self.db_limiter)
        except (CkptfsError, OSError, RuntimeError) as exc:
            if not self._failing:
                log.warning("could not gather live statistics: %s", exc)
                self._failing = True
            return
        except Exception as exc:  # sqlite3.Error and the like: statistics must not stop the daemon
            if not self._failing:
                log.warning("could not gather live statistics: %r", exc)
                self._failing = True
            return
        self._failing = False
        now = time.monotonic()
        written, read = APP.written, APP.read
        if self._rate_mark is not None and now - self._rate_mark[0] > 0:
            dt = now - self._rate_mark[0]
            self._rates = ((written - self._rate_mark[1]) / dt, (read - self._rate_mark[2]) / dt)
        self._rate_mark = (now, written, read)
        budget = self.budget
        backlog = catalog_facts.get("backlog")
        health = self._health(pending=bool(backlog and backlog["chunks"]))
        if backlog is not None:
            # The rate the daemon measures now, not the last one it published: 0 when
            # nothing went up lately, and no ETA while it is 0 or a remote fails.
            rate = self._upload_rate(now)
            failing = [n for n, h in health.items() if h["kind"] != "local"
                       and h["state"] != HEALTHY]
            backlog["upload_rate_bytes_s"] = rate
            backlog["remote_failing"] = failing
            backlog["eta_s"] = 0.0 if not backlog["bytes"] else (
                backlog["bytes"] / rate if rate > 0 and not failing else None)
        self.facts = {
            "capacity": capacity,
            "health": health,
            **catalog_facts,
            "app": {"written_bytes": int(written), "read_bytes": int(read),
                    "write_bytes_per_s": round(self._rates[0]),
                    "read_bytes_per_s": round(self._rates[1])},
            "memory": {"used": budget.used, "limit": budget.limit,
                       "writers_waiting_for_room": self.store.waiting_for_room},
            "refreshed": time.time(),
        }
        self._publish(capacity, health)

    def _publish(
        self, capacity: dict[str, dict[str, Any]], health: dict[str, dict[str, Any]]
    ) -> None:
        """Into the stats snapshot: each tier's capacity and health, and the facts."""
        stats = self.store.stats
        stats.tier_extra = {name: {"capacity": c, **{k: v for k, v in health.get(name, {}).items()
                                                     if k != "kind"}}
                            for name, c in capacity.items()}
        stats.extra = {
            "mountpoint": self.mountpoint,
            "metrics": self.endpoint.address,
            "metrics_requested": self.endpoint.requested,
            "backlog": self.facts.get("backlog"),
            "remote_durable": self.facts.get("remote_durable", {}),
            "checkpoint_states": self.facts.get("checkpoint_states", {}),
            "app": self.facts["app"],
            "memory": self.facts["memory"],
            "residency": self.store.residency.status(),
            "scrub": None if self.scrub is None else self.scrub(),
        }

    def _upload_rate(self, now: float) -> float:
        """Bytes/s uploaded over the last UPLOAD_RATE_WINDOW_S (0.0 if nothing was)."""
        up = self.uploader.uploaded_bytes
        self._uploaded.append((now, up))
        while len(self._uploaded) > 1 and now - self._uploaded[0][0] > UPLOAD_RATE_WINDOW_S:
            self._uploaded.popleft()
        t0, b0 = self._uploaded[0]
        return round((up - b0) / (now - t0), 1) if now > t0 else 0.0

    def _health(self, pending: bool) -> dict[str, dict[str, Any]]:
        """Per tier, what the daemon knows now: a remote's failure streak (tiers/health.py),
        its failing uploads and their retry while uploads are ``pending`` (a failure of a
        job since cancelled says nothing), read errors (a degraded tier)."""
        out: dict[str, dict[str, Any]] = {}
        for name, ts in list(self.store.stats.tiers.items()):
            tier = self.store.tiers.get(name)
            h = getattr(tier, "health", None)
            seen = h.snapshot() if isinstance(h, Health) else {}
            failures = int(seen.get("consecutive_failures") or 0)
            state, error, at = HEALTHY, seen.get("last_error"), seen.get("last_error_at")
            if failures:
                state = str(seen["state"])
            elif ts.upload_error is not None and pending:
                state = ts.upload_error_state or FAILING
                error, at = ts.upload_error, ts.upload_error_at
            elif ts.degraded is not None:
                state, error, at = "degraded", ts.degraded, ts.degraded_since
            out[name] = {
                "kind": ts.kind, "state": state, "last_error": error, "last_error_at": at,
                "consecutive_failures": failures, "last_ok_at": seen.get("last_ok_at"),
                "backoff_s": ts.upload_backoff_s, "retry_at": ts.upload_retry_at,
                "fenced": getattr(tier, "fenced", None),
            }
        return out

    def _capacity(self) -> dict[str, dict[str, Any]]:
        """Blocking: capacity of every tier (a remote reports only what ckptfs stored)."""
        out: dict[str, dict[str, Any]] = {}
        for name, tier in self.store.tiers.items():
            try:
                u = tier.usage()
            except CkptfsError as exc:
                out[name] = {"total": None, "free": None, "used": None, "error": str(exc)[:200]}
                continue
            if tier.kind == "local":
                out[name] = {"total": u.total, "free": u.free, "used": u.used, "capped": u.capped}
            else:
                out[name] = {"total": None, "free": None, "used": u.used, "capped": False}
        return out

    def _catalog_facts(self) -> dict[str, Any]:
        """Blocking, in the catalog's thread (db limiter held)."""
        cat = self.catalog
        remotes = [t.name for t in self.store.remotes]
        out: dict[str, Any] = {}
        if remotes:
            b = cat.backlog()
            age = None if b.oldest_enqueued_ns is None else max(0.0, (time.time_ns() - b.oldest_enqueued_ns) / 1e9)
            rate = None
            raw = cat.get_meta("upload_rate")
            if raw is not None:
                bps, at_ns = raw.split()
                if (time.time_ns() - int(at_ns)) / 1e9 < 60:
                    rate = float(bps)
            out["backlog"] = {
                "chunks": b.chunks, "bytes": b.bytes, "oldest_age_s": age, "blocked": b.blocked,
                "last_error": b.last_error, "upload_rate_bytes_s": rate,
                "eta_s": (b.bytes / rate) if rate and b.bytes else (0.0 if not b.bytes else None),
                "uploaded_bytes": self.uploader.uploaded_bytes,
            }
        out["deletions"] = [
            {"tier": q.tier, "chunks": q.chunks, "bytes": q.bytes, "failing": q.failing,
             "oldest_age_s": None if q.oldest_enqueued_ns is None
             else max(0.0, (time.time_ns() - q.oldest_enqueued_ns) / 1e9)}
            for q in cat.deletion_backlog()
        ]
        out["namespaces"] = [
            {"path": u.ns, "used_bytes": u.bytes, "files": u.files, "quota_bytes": u.quota}
            for u in cat.namespace_usage()
        ]
        rows = cat.checkpoint_rows("/")
        states: dict[str, int] = {}
        latest: dict[str, dict[str, Any]] = {}
        committed: dict[str, list[CheckpointRow]] = {}
        for r in rows:
            states[r.state.value] = states.get(r.state.value, 0) + 1
            if r.state is not CheckpointState.COMMITTED:
                continue
            committed.setdefault(run_of(r.root), []).append(r)
            if self._seen.get(r.id) != r.commit_ns:
                self._seen[r.id] = r.commit_ns
                if self._primed:
                    self._observe(r)
        self._primed = True
        for run, rs in committed.items():
            rs.sort(key=_newest_first, reverse=True)
            latest[run] = _brief(rs[0])
        now = time.monotonic()
        if remotes and now - self._durable_checked >= self.DURABLE_CHECK_S:
            self._durable_checked = now
            self._remote_durable = self._find_remote_durable(committed, set(remotes))
        out["checkpoint_states"] = states
        out["latest"] = latest
        out["remote_durable"] = self._remote_durable if remotes else {}
        return out

    def _observe(self, row: CheckpointRow) -> None:
        """A checkpoint committed while this daemon runs: its save time and skew."""
        try:
            info = summarize(self.catalog, Path(self.mountpoint or "/"), row)
        except CkptfsError:
            return
        if info.write_s is not None:
            CHECKPOINT_SAVE_SECONDS.observe(max(0.0, info.write_s))
        if info.completion_skew_s is not None:
            CHECKPOINT_SKEW_SECONDS.observe(max(0.0, info.completion_skew_s))

    def _find_remote_durable(
        self, committed: dict[str, list[CheckpointRow]], remotes: set[str]
    ) -> dict[str, dict[str, Any]]:
        """Per run, the newest committed checkpoint durable on the remote
        (catalog/durability.py: what a new node would recover)."""
        out: dict[str, dict[str, Any]] = {}
        for run, rows in committed.items():  # newest first (sorted by the caller)
            for r in rows[:8]:
                key = (r.root, r.commit_ns or 0)
                if key not in self._durable:
                    if not checkpoint_durable(self.catalog, key[0], key[1], remotes):
                        continue
                    self._durable.add(key)
                out[run] = _brief(r)
                break
        return out


def _newest_first(row: CheckpointRow) -> tuple[int, int]:
    return (-1 if row.step is None else row.step, row.commit_ns or 0)


def _brief(row: CheckpointRow) -> dict[str, Any]:
    return {"root": row.root, "step": row.step, "framework": row.framework,
            "commit_ns": row.commit_ns}


class FsCollector(Collector):
    """Metrics read at scrape time from the telemetry snapshot and live counters."""

    def __init__(self, telemetry: Telemetry) -> None:
        self.t = telemetry

    def collect(self) -> Iterator[Metric]:
        fs = self.t
        facts = self.t.facts
        stats = fs.store.stats
        yield from self._info()
        kinds = {n: ("local" if t.kind == "local" else "remote") for n, t in fs.store.tiers.items()}
        yield from self._tier_io(kinds, stats, facts.get("health", {}))
        yield from self._tier_space(kinds, facts)
        yield from self._counters(stats)
        yield from self._services(stats)
        yield from self._backlog(facts.get("backlog"))
        yield from self._deletions(facts.get("deletions") or [])
        yield from self._namespaces(facts.get("namespaces") or [])
        yield from self._checkpoints(facts)
        yield from self._memory(facts)
        if fs.scrub is not None:
            yield from scrub_metrics(fs.scrub())
        refreshed = facts.get("refreshed")
        yield GaugeMetricFamily(
            "ckptfs_stats_age_seconds",
            "Seconds since the daemon last refreshed its statistics (should stay near 1)",
            value=(time.time() - refreshed) if refreshed else math.nan)

    @staticmethod
    def _tier_io(
        kinds: dict[str, str], stats: Stats, health: dict[str, dict[str, Any]]
    ) -> Iterator[Metric]:
        """Each tier's reads, writes, errors, health and latency."""
        labels = ["tier", "kind"]
        rb = CounterMetricFamily("ckptfs_tier_read_bytes", "Chunk bytes read from each tier",
                                 labels=labels)
        wb = CounterMetricFamily(
            "ckptfs_tier_written_bytes",
            "Chunk payload bytes written to each tier (new chunks and repairs on local tiers, "
            "uploads on remote ones)", labels=labels)
        reads = CounterMetricFamily("ckptfs_tier_reads", "Chunk reads from each tier", labels=labels)
        errs = CounterMetricFamily("ckptfs_tier_errors", "I/O errors of each tier", labels=labels)
        up = GaugeMetricFamily("ckptfs_tier_healthy",
                               "1 if the tier is healthy, 0 while degraded (reads failed there) "
                               "or, for a remote, unreachable, refusing or failing uploads",
                               labels=labels)
        lat = GaugeMetricFamily("ckptfs_tier_read_latency_seconds",
                                "Measured latency of small reads (moving average)", labels=labels)
        for name, ts in list(stats.tiers.items()):
            lv = [name, kinds.get(name, ts.kind)]
            rb.add_metric(lv, ts.read_bytes)
            wb.add_metric(lv, ts.write_bytes)
            reads.add_metric(lv, ts.reads)
            errs.add_metric(lv, ts.errors)
            now_ok = health.get(name, {}).get("state", HEALTHY) == HEALTHY
            up.add_metric(lv, 0 if ts.degraded or not now_ok else 1)
            lat.add_metric(lv, ts.latency_s)
        yield from (rb, wb, reads, errs, up, lat)

    def _tier_space(self, kinds: dict[str, str], facts: dict[str, Any]) -> Iterator[Metric]:
        """Each tier's capacity, free and used bytes; copies outside their residency."""
        labels = ["tier", "kind"]
        total = GaugeMetricFamily("ckptfs_tier_capacity_bytes",
                                  "Bytes a local tier may hold (device size or its cap)",
                                  labels=labels)
        free = GaugeMetricFamily("ckptfs_tier_free_bytes",
                                 "Bytes still available to ckptfs on a local tier", labels=labels)
        used = GaugeMetricFamily("ckptfs_tier_used_bytes",
                                 "Bytes of chunk frames ckptfs holds on each tier", labels=labels)
        for name, c in facts.get("capacity", {}).items():
            lv = [name, kinds.get(name, "local")]
            if c.get("total") is not None:
                total.add_metric(lv, c["total"])
            if c.get("free") is not None:
                free.add_metric(lv, c["free"])
            if c.get("used") is not None:
                used.add_metric(lv, c["used"])
        yield from (total, free, used)
        out = GaugeMetricFamily(
            "ckptfs_residency_copies_out",
            "Copies on a tier outside their chunk's allowed locations, found at mount (a tier "
            "relabelled); reads skip them, fsck --repair deletes them", labels=labels)
        for name, n in self.t.store.residency.out_counts.items():
            out.add_metric([name, kinds.get(name, "local")], n)
        yield out

    def _counters(self, stats: Stats) -> Iterator[Metric]:
        """The daemon's event counters and byte totals."""
        fs = self.t
        counters = dict(stats.counters)
        for key, doc in _COUNTERS.items():
            yield CounterMetricFamily(f"ckptfs_{key}", doc, value=counters.pop(key, 0))
        other = CounterMetricFamily("ckptfs_events", "Other daemon event counters", labels=["event"])
        for key, n in sorted(counters.items()):
            if key not in ("evicted_bytes", "uploaded_bytes"):
                other.add_metric([key], n)
        yield other
        yield CounterMetricFamily(
            "ckptfs_evicted_bytes",
            "Bytes of local chunk copies evicted (a remote tier holds them)",
            value=fs.store.evicted_bytes)
        yield CounterMetricFamily("ckptfs_app_written_bytes",
                                  "Bytes applications wrote through the mount", value=APP.written)
        yield CounterMetricFamily(
            "ckptfs_app_read_bytes",
            "Bytes applications read through the mount, as replies or as pages ckptfs put "
            "in the kernel's page cache for them (restore throughput: its rate)",
            value=APP.read)
        yield CounterMetricFamily("ckptfs_uploaded_bytes", "Chunk bytes uploaded to remote tiers",
                                  value=fs.uploader.uploaded_bytes)

    @staticmethod
    def _services(stats: Stats) -> Iterator[Metric]:
        # Background services contained after an unexpected error (ckptfs/supervise.py).
        faults = CounterMetricFamily("ckptfs_service_errors",
                                     "Unexpected errors of each background service or task, "
                                     "contained (the service restarted)", labels=["service"])
        degraded = GaugeMetricFamily("ckptfs_service_degraded",
                                     "1 while a service's last unexpected error is recent",
                                     labels=["service"])
        for x in stats.service_states():
            faults.add_metric([x["name"]], x["errors"])
            degraded.add_metric([x["name"]], 1 if x["state"] == "degraded" else 0)
        yield from (faults, degraded)

    def _memory(self, facts: dict[str, Any]) -> Iterator[Metric]:
        """The memory budget and the writers waiting for room."""
        fs = self.t
        mem = facts.get("memory", {})
        yield GaugeMetricFamily("ckptfs_memory_budget_used_bytes",
                                "Memory budget held by chunk buffers of files being written",
                                value=fs.budget.used)
        yield GaugeMetricFamily("ckptfs_memory_budget_limit_bytes", "The memory budget",
                                value=fs.budget.limit)
        yield GaugeMetricFamily(
            "ckptfs_writers_waiting_for_room",
            "Chunk writes waiting for uploads to free local room (backpressure)",
            value=mem.get("writers_waiting_for_room", fs.store.waiting_for_room))

    def _info(self) -> Iterator[Metric]:
        info = GaugeMetricFamily("ckptfs_info", "The daemon: version, mount point",
                                 labels=["version", "mountpoint"])
        info.add_metric([__version__, self.t.mountpoint or ""], 1)
        yield info

    @staticmethod
    def _backlog(b: dict[str, Any] | None) -> Iterator[Metric]:
        b = b or {}
        yield GaugeMetricFamily("ckptfs_upload_backlog_bytes",
                                "Chunk bytes committed but not yet on the remote tiers",
                                value=b.get("bytes", 0))
        yield GaugeMetricFamily("ckptfs_upload_backlog_chunks",
                                "Upload jobs pending (a chunk per remote copy)",
                                value=b.get("chunks", 0))
        yield GaugeMetricFamily("ckptfs_upload_backlog_oldest_age_seconds",
                                "Age of the oldest pending upload (0 when none)",
                                value=b.get("oldest_age_s") or 0.0)
        yield GaugeMetricFamily("ckptfs_upload_blocked_chunks",
                                "Upload jobs blocked by a permanent error (credentials, bucket)",
                                value=b.get("blocked", 0))
        rate = b.get("upload_rate_bytes_s")
        yield GaugeMetricFamily("ckptfs_upload_rate_bytes_per_second",
                                "Upload rate measured over the last window (NaN: none recent)",
                                value=math.nan if rate is None else rate)

    @staticmethod
    def _deletions(queues: list[dict[str, Any]]) -> Iterator[Metric]:
        n = GaugeMetricFamily("ckptfs_deletion_backlog",
                              "Chunk frames waiting in the deletion queue, per tier", labels=["tier"])
        b = GaugeMetricFamily("ckptfs_deletion_backlog_bytes",
                              "Bytes of chunk frames waiting in the deletion queue, per tier",
                              labels=["tier"])
        f = GaugeMetricFamily("ckptfs_deletion_retrying",
                              "Queued deletions whose last attempt failed, per tier", labels=["tier"])
        for q in queues:
            n.add_metric([q["tier"]], q["chunks"])
            b.add_metric([q["tier"]], q["bytes"])
            f.add_metric([q["tier"]], q["failing"])
        yield from (n, b, f)
        ages = [q["oldest_age_s"] for q in queues if q["oldest_age_s"] is not None]
        yield GaugeMetricFamily("ckptfs_deletion_backlog_oldest_age_seconds",
                                "Age of the oldest queued deletion (0 when none)",
                                value=max(ages) if ages else 0.0)

    @staticmethod
    def _namespaces(rows: list[dict[str, Any]]) -> Iterator[Metric]:
        used = GaugeMetricFamily("ckptfs_namespace_used_bytes",
                                 "Bytes (st_size) of the files of each namespace, committed",
                                 labels=["namespace"])
        files = GaugeMetricFamily("ckptfs_namespace_files", "Files counted in each namespace",
                                  labels=["namespace"])
        quota = GaugeMetricFamily("ckptfs_namespace_quota_bytes",
                                  "The quota of each namespace that has one", labels=["namespace"])
        for r in rows:
            used.add_metric([r["path"]], r["used_bytes"])
            files.add_metric([r["path"]], r["files"])
            if r["quota_bytes"] is not None:
                quota.add_metric([r["path"]], r["quota_bytes"])
        yield from (used, files, quota)

    @staticmethod
    def _checkpoints(facts: dict[str, Any]) -> Iterator[Metric]:
        st = GaugeMetricFamily("ckptfs_checkpoints", "Checkpoints known to the catalog, by state",
                               labels=["state"])
        for state, n in sorted(facts.get("checkpoint_states", {}).items()):
            st.add_metric([state], n)
        yield st
        for key, what in (("latest", "the newest committed checkpoint"),
                          ("remote_durable", "the newest checkpoint durable on the remote")):
            step = GaugeMetricFamily(f"ckptfs_checkpoint_{key}_step",
                                     f"Step of {what}, per run (-1: no step)", labels=["run"])
            ts = GaugeMetricFamily(f"ckptfs_checkpoint_{key}_timestamp_seconds",
                                   f"Commit time of {what}, per run", labels=["run"])
            for run, c in sorted(facts.get(key, {}).items()):
                label = readable(run)  # the exposition is UTF-8 (ckptfs/names.py)
                step.add_metric([label], -1 if c["step"] is None else c["step"])
                ts.add_metric([label], (c["commit_ns"] or 0) / 1e9)
            yield step
            yield ts
