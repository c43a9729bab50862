"""The writer lease: one node at a time writes a bucket prefix.

Two nodes mounting the same prefix read-write would overwrite each other's catalog
snapshot (and delete each other's chunks as garbage). So a mount takes a lease on every
remote tier, the object ``<prefix>/meta/writer``::

    {"version": 1, "writer_id": "<hex>", "host": "node7", "pid": 1234,
     "state_dir": "/var/lib/ckptfs", "heartbeat": 1767225600.25, "released": false}

``writer_id`` is random, made once per state dir (the file ``<state dir>/writer_id``; not
in the catalog, whose snapshot a new node restores). A tracked task of the daemon renews the
heartbeat every ``heartbeat_s`` (30 s); a lease whose heartbeat is older than ``timeout_s``
(3 heartbeats) is stale. At mount, a lease held by another writer id with a fresh heartbeat
refuses the mount (``LeaseConflict``, naming the holder), unless ``--takeover``; a stale or
released one is taken over. A clean unmount marks the lease released (the object stays, so
fsck can tell which node wrote the prefix last).

Every write of the lease is conditional (If-None-Match: * to create it, If-Match: <ETag of
what was read> to replace it), and is read back: two nodes racing for a free lease cannot
both win. A server without conditional writes gets plain PUTs plus the read-back, which
leaves a window of one heartbeat in which both might believe they hold it (remote.md).

While a node does not hold the lease of a tier, that tier is fenced (``S3Tier.fence``):
uploads, deletions and snapshots to it fail, reads go on, data stays local. If the remote
cannot be reached at mount (no answer to a HEAD with short timeouts, mount.py), the mount
does not wait for it: it goes on fenced and the heartbeat task, whose first heartbeat runs
at once, keeps trying to take the lease. A node that finds its lease taken by another writer (``--takeover``
elsewhere) stays fenced until it is remounted.

A heartbeat tries a transient error (a 500, a dropped connection, a reply lost after the
PUT landed) again after a short pause (0.5 s, doubling), at most ``RETRY_ATTEMPTS`` (4)
attempts within ``retry_budget_s`` (15 s); every attempt reads the lease before its
conditional write, so a renewal that landed unseen changed nothing but the ETag it reads.
Only a heartbeat that still fails logs the warning (once, until one succeeds). Taking the
lease at mount and releasing it at unmount retry the same way.

The watchdog: a holder fences its tier ``window_s`` (timeout less one heartbeat: 60 s)
after the heartbeat time of its last renewal, unless a renewal came by then; others
would soon call the lease stale. A task beside the heartbeat's, with a deadline
(``trio.move_on_at``) that each heartbeat's end moves, does it on the trio side, so a
heartbeat hung in a request to a hung object store cannot delay it. The next renewal
lifts the fence. The heartbeat thread and the watchdog decide under one lock per lease.

Clocks: ages compare the holder's wall clock (``heartbeat``) with ours, so node clocks must
agree to well within ``timeout_s`` (NTP does).

Tests shorten the intervals with the environment variables ``CKPTFS_LEASE_HEARTBEAT_S`` and
``CKPTFS_LEASE_TIMEOUT_S`` (seconds; the timeout defaults to 3 heartbeats).
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TypeVar

import trio

from ..errors import CkptfsError, ConfigError, TierError, TransientTierError
from ..tiers.s3 import ConditionalWriteUnsupported, PreconditionFailed, S3Tier

log = logging.getLogger("ckptfs.lease")
_T = TypeVar("_T")

LEASE_NAME = "writer"
WRITER_ID_FILE = "writer_id"
DEFAULT_HEARTBEAT_S = 30.0
TIMEOUT_HEARTBEATS = 3
ENV_HEARTBEAT = "CKPTFS_LEASE_HEARTBEAT_S"
ENV_TIMEOUT = "CKPTFS_LEASE_TIMEOUT_S"
LEASE_VERSION = 1
_ACQUIRE_ROUNDS = 5  # re-read and decide again after a lost race, at most this often
RETRY_ATTEMPTS = 4  # attempts of one heartbeat against transient errors
RETRY_FIRST_PAUSE_S = 0.5  # the pause before its first retry; each next one doubles


class LeaseConflict(CkptfsError):
    """Another node holds the writer lease of a prefix (the mount refuses)."""


class TransientLeaseError(TierError):
    """The lease object kept changing while a heartbeat tried to renew it."""


@dataclass(frozen=True)
class LeaseTiming:
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    timeout_s: float = TIMEOUT_HEARTBEATS * DEFAULT_HEARTBEAT_S

    @property
    def window_s(self) -> float:
        """How long a holder writes after its last renewal: a heartbeat less than the
        timeout, so it stops before others may call its lease stale (60 s)."""
        return self.timeout_s - self.heartbeat_s

    @property
    def retry_budget_s(self) -> float:
        """How long one heartbeat may go on retrying: half of the shorter of the period
        and the window (15 s). No attempt starts after it, so a heartbeat whose requests
        are answered ends within its period, well before the deadline (one that hangs in a
        request is the watchdog's). A pause between attempts is at most a quarter of it."""
        return min(self.heartbeat_s, self.window_s) / 2


def _env_seconds(environ: Mapping[str, str], name: str) -> float | None:
    raw = environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0.01 <= value <= 86400:
        raise ConfigError(f"{name}: expected seconds from 0.01 to 86400, got {raw!r}")
    return value


def lease_timing(environ: Mapping[str, str] = os.environ) -> LeaseTiming:
    """The heartbeat interval and timeout: defaults, or the environment's (for tests)."""
    heartbeat = _env_seconds(environ, ENV_HEARTBEAT) or DEFAULT_HEARTBEAT_S
    timeout = _env_seconds(environ, ENV_TIMEOUT) or TIMEOUT_HEARTBEATS * heartbeat
    if timeout <= heartbeat:
        raise ConfigError(
            f"{ENV_TIMEOUT}: the lease timeout ({timeout:g} s) must exceed the heartbeat "
            f"interval ({heartbeat:g} s)"
        )
    return LeaseTiming(heartbeat, timeout)


def writer_id(state_dir: Path, *, create: bool = True) -> str | None:
    """This state dir's writer id, made on first use (None if absent and not ``create``)."""
    path = state_dir / WRITER_ID_FILE
    try:
        found = path.read_text().strip()
    except FileNotFoundError:
        found = ""
    if found or not create:
        return found or None
    new = uuid.uuid4().hex
    tmp = path.with_name(f"{WRITER_ID_FILE}.tmp")
    with open(tmp, "w") as f:
        f.write(new + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return new


@dataclass(frozen=True)
class Lease:
    """The content of a lease object."""

    writer_id: str
    host: str
    pid: int
    state_dir: str
    heartbeat: float  # unix time of the holder's last heartbeat
    released: bool = False

    def to_bytes(self) -> bytes:
        return json.dumps({"version": LEASE_VERSION, **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Lease:
        """Raises ValueError unless ``raw`` is a lease."""
        try:
            d = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not JSON ({exc})") from None
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        wid, beat = d.get("writer_id"), d.get("heartbeat")
        if not isinstance(wid, str) or not wid:
            raise ValueError("no writer_id")
        if isinstance(beat, bool) or not isinstance(beat, int | float) or not math.isfinite(beat):
            raise ValueError("no heartbeat time")
        pid = d.get("pid")
        return cls(
            writer_id=wid,
            host=str(d.get("host", "?")),
            pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else -1,
            state_dir=str(d.get("state_dir", "?")),
            heartbeat=float(beat),
            released=d.get("released") is True,
        )

    def age(self, now: float) -> float:
        return now - self.heartbeat

    def describe(self, now: float) -> str:
        return (f"host {self.host}, pid {self.pid}, state dir {self.state_dir}, "
                f"last heartbeat {_ago(self.age(now))}")


def _ago(seconds: float) -> str:
    if seconds < 0:
        return f"{-seconds:.0f} s in the future (clock skew?)"
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


@dataclass(frozen=True)
class LeaseState:
    """What a read of the lease object found."""

    etag: str | None  # None: no lease object
    lease: Lease | None  # None: missing, or unreadable (then ``problem`` says why)
    problem: str | None = None


def read_lease(tier: S3Tier) -> LeaseState:
    """The lease object of ``tier`` (TierError if the remote cannot be read)."""
    found = tier.get_meta_tagged(LEASE_NAME)
    if found is None:
        return LeaseState(None, None)
    raw, etag = found
    try:
        return LeaseState(etag, Lease.from_bytes(raw))
    except ValueError as exc:
        return LeaseState(etag, None, f"unreadable lease object: {exc}")


def held_elsewhere(state: LeaseState, me: str | None, timing: LeaseTiming, now: float) -> bool:
    """True if a live writer other than ``me`` holds the lease (fresh and not released)."""
    lease = state.lease
    if state.etag is None:
        return False
    if lease is None:
        return True  # unreadable: assume the worst
    return lease.writer_id != me and not lease.released and lease.age(now) < timing.timeout_s


def where(tier: S3Tier) -> str:
    return f"s3://{tier.bucket}/{tier.prefix}"


class WriterLease:
    """The writer lease on one remote tier. Blocking methods (``acquire``, ``heartbeat``,
    ``release``): call them from a thread. ``deadline`` and ``expire`` do no I/O (the
    watchdog calls them on the trio thread).

    ``clock`` is the wall clock written into the lease; ``monotonic`` measures how long ago
    the lease was last renewed, and ``sleep`` pauses between the attempts of a heartbeat
    (tests inject both)."""

    def __init__(
        self, tier: S3Tier, me: Lease, timing: LeaseTiming, *, takeover: bool = False,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.tier = tier
        self.me = me
        self.timing = timing
        self.takeover = takeover
        self.clock = clock
        self.monotonic = monotonic
        self.sleep = sleep
        # The heartbeat thread and the watchdog (trio thread) both decide on the fence
        # from the state below: those decisions and their fence calls run under this lock
        # (O(1) steps, never I/O).
        self._lock = threading.Lock()
        self.held = False
        self.lost = False  # another writer took it: stay fenced until remounted
        self.conditional = True  # False once the server refused conditional writes
        self.failing = False  # the last heartbeat could not reach the remote (log once)
        self.problem: str | None = None  # what the last failed attempt said
        # ``monotonic()`` when the heartbeat time of the last lease written (and read back)
        # was stamped: the lease is fresh for ``timeout_s`` from then in others' eyes.
        self.renewed_at = 0.0
        self.expired = False  # fenced because the lease was not renewed in time

    # -- one write, conditional ----------------------------------------------------------------

    def _write(self, lease: Lease, etag: str | None) -> None:
        data = lease.to_bytes()
        if self.conditional:
            try:
                self.tier.put_meta_if(LEASE_NAME, data, etag=etag)
                return
            except ConditionalWriteUnsupported as exc:
                log.warning("tier %s: %s; the writer lease falls back to write-then-read-back "
                            "(two nodes racing may both win for one heartbeat)", self.tier.name, exc)
                self.conditional = False
        self.tier.put_meta_if(LEASE_NAME, data, etag=etag, conditional=False)

    def _mine(self) -> LeaseState | None:
        """Read back: the state if the lease names us, else None."""
        state = read_lease(self.tier)
        if state.lease is not None and state.lease.writer_id == self.me.writer_id:
            return state
        return None

    # -- mount, heartbeat, unmount -----------------------------------------------------------

    def acquire(self) -> None:
        """Take the lease, or raise LeaseConflict naming the holder. TierError passes
        through (the remote cannot be reached)."""
        for _ in range(_ACQUIRE_ROUNDS):
            state = read_lease(self.tier)
            now, stamped = self.clock(), self.monotonic()
            other = state.lease
            if state.etag is not None:
                if other is None:
                    if not self.takeover:
                        raise LeaseConflict(
                            f"remote tier {self.tier.name} ({where(self.tier)}): {state.problem}; "
                            "refusing to mount read-write (use --takeover if no other node "
                            "writes this prefix)"
                        )
                    log.warning("--takeover: replacing the %s of remote tier %s (%s)",
                                state.problem, self.tier.name, where(self.tier))
                elif other.writer_id == self.me.writer_id:
                    log.info("writer lease of remote tier %s (%s): ours from an earlier mount",
                             self.tier.name, where(self.tier))
                elif other.released:
                    log.info("taking the writer lease of remote tier %s (%s), released by %s",
                             self.tier.name, where(self.tier), other.describe(now))
                elif other.age(now) >= self.timing.timeout_s:
                    log.info("taking over the stale writer lease of remote tier %s (%s) from %s",
                             self.tier.name, where(self.tier), other.describe(now))
                elif self.takeover:
                    log.warning("--takeover: taking the writer lease of remote tier %s (%s) from "
                                "a live holder: %s", self.tier.name, where(self.tier),
                                other.describe(now))
                else:
                    raise LeaseConflict(
                        f"remote tier {self.tier.name} ({where(self.tier)}) is in use by another "
                        f"writer: {other.describe(now)}; refusing to mount read-write "
                        f"(unmount it there, or use --takeover if that node is gone)"
                    )
            try:
                self._write(replace(self.me, heartbeat=now, released=False), state.etag)
            except PreconditionFailed:
                continue  # someone wrote it since we read it: look again
            if self._mine() is not None:
                with self._lock:
                    self.held = True
                    self.lost = False
                    self.expired = False
                    self.renewed_at = stamped
                if state.etag is None:
                    log.info("took the writer lease of remote tier %s (%s)", self.tier.name,
                             where(self.tier))
                return
        raise LeaseConflict(
            f"remote tier {self.tier.name} ({where(self.tier)}): the writer lease changed hands "
            f"{_ACQUIRE_ROUNDS} times while this node tried to take it; refusing to mount"
        )

    def heartbeat(self) -> None:
        """Renew the lease (or take it, if the mount could not). Never raises TierError.
        A transient error (a 500, a dropped connection, a lost reply) is tried again after
        a short pause, up to ``RETRY_ATTEMPTS`` attempts within ``timing.retry_budget_s``;
        each attempt reads the lease before it writes. A heartbeat that still fails is
        logged (once, until one succeeds) and fences the tier as needed."""
        if self.lost:
            return
        try:
            self.retrying("heartbeat", self._attempt)
        except LeaseConflict as exc:
            self._lose(str(exc))
            return
        except TierError as exc:
            self._failed(exc)
            return
        self.problem = None
        if self.failing:
            log.info("writer lease of remote tier %s renewed again", self.tier.name)
            self.failing = False

    def retrying(self, what: str, op: Callable[[], _T]) -> _T:
        """``op()``, tried again after a transient error: a short pause (0.5 s, doubling),
        at most ``RETRY_ATTEMPTS`` attempts, none started after ``timing.retry_budget_s``.
        Raises the last error."""
        began = self.monotonic()
        attempt = 0
        while True:
            try:
                return op()
            except TransientTierError as exc:
                self.problem = str(exc)  # for the watchdog, should the next attempt hang
                pause = self._retry_pause(attempt, began)
                if pause is None:
                    raise
                attempt += 1
                log.info("writer lease of remote tier %s, %s: %s; trying again in %.2g s "
                         "(attempt %d of %d)", self.tier.name, what, exc, pause, attempt + 1,
                         RETRY_ATTEMPTS)
                self.sleep(pause)

    def _retry_pause(self, attempt: int, began: float) -> float | None:
        """The pause before attempt ``attempt + 2``, or None: no more."""
        if attempt + 1 >= RETRY_ATTEMPTS:
            return None
        budget = self.timing.retry_budget_s
        pause = min(RETRY_FIRST_PAUSE_S * 2**attempt, budget / 4)
        if self.monotonic() - began + pause > budget:
            return None
        return pause

    def _attempt(self) -> None:
        if not self.held:
            self.acquire()
            with self._lock:
                self.tier.fence(None)
            log.info("writer lease of remote tier %s (%s) held now; writes to it go on",
                     self.tier.name, where(self.tier))
            return
        stamped = self._renew()
        with self._lock:
            self.renewed_at = max(self.renewed_at, stamped)
            # A renewal stamped so long ago that its lease is due to expire already (its
            # request hung) does not lift the fence: the next heartbeat, due at once, does.
            fresh = self.monotonic() - self.renewed_at < self.timing.window_s
            if self.expired and fresh:
                self.tier.fence(None)
                self.expired = False
                unfenced = True
            else:
                unfenced = False
        if unfenced:
            log.info("writer lease of remote tier %s renewed: writes to it go on again",
                     self.tier.name)

    def _failed(self, exc: TierError) -> None:
        self.problem = str(exc)
        if not self.failing:
            log.warning("writer lease of remote tier %s: cannot reach the remote (%s); "
                        "retrying every %.3g s", self.tier.name, exc, self.timing.heartbeat_s)
            self.failing = True
        with self._lock:
            if not self.held:
                self.tier.fence(f"the writer lease of this prefix is not taken yet ({exc})")
                return
            seen = self.renewed_at
        if self.monotonic() - seen >= self.timing.window_s:
            self.expire(seen)  # the watchdog has, unless it does not run (a bare heartbeat)

    def _renew(self) -> float:
        """Write our lease again over the one read just before; the ``monotonic()`` time
        its heartbeat was stamped."""
        for _ in range(_ACQUIRE_ROUNDS):
            state = read_lease(self.tier)
            now, stamped = self.clock(), self.monotonic()
            if state.etag is not None and (
                state.lease is None or state.lease.writer_id != self.me.writer_id
            ):
                holder = state.lease.describe(now) if state.lease else str(state.problem)
                raise LeaseConflict(f"taken over by another writer: {holder}")
            try:
                self._write(replace(self.me, heartbeat=now, released=False), state.etag)
            except PreconditionFailed:
                continue  # written since we read it (by us too: a PUT that landed late)
            if self._mine() is None:
                continue
            return stamped
        raise TransientLeaseError(f"tier {self.tier.name}: the lease kept changing while renewing it")

    # -- the watchdog's side (trio thread; no I/O) --------------------------------------------

    def deadline(self) -> tuple[float, float]:
        """``(renewed_at, seconds left)``: the tier must be fenced that many seconds from
        now unless ``renewed_at`` changes (inf while there is nothing to watch: the lease
        is not held, or the tier is fenced already)."""
        with self._lock:
            if not self.held or self.expired:
                return self.renewed_at, math.inf
            return self.renewed_at, self.renewed_at + self.timing.window_s - self.monotonic()

    def expire(self, seen: float) -> bool:
        """Fence the tier if the lease, held, was not renewed since ``seen`` (its
        ``renewed_at``): others will soon see it as stale and may take it. True if fenced
        now."""
        window = self.timing.window_s
        detail = self.problem or "a renewal is still waiting for the remote"
        with self._lock:
            if not self.held or self.expired or self.renewed_at != seen:
                return False
            self.expired = True
            self.tier.fence(f"the writer lease of this prefix could not be renewed for "
                            f"{window:.3g} s ({detail})")
        log.warning("writer lease of remote tier %s (%s) not renewed for %.3g s (%s): writes "
                    "to it stop until a renewal shows the lease is still this node's",
                    self.tier.name, where(self.tier), window, detail)
        return True

    def _lose(self, why: str) -> None:
        with self._lock:
            self.held = False
            self.lost = True
            self.tier.fence(f"another node holds the writer lease of this prefix ({why})",
                            permanent=True)
        log.error("writer lease of remote tier %s (%s) lost: %s; this node no longer writes to "
                  "it (new data stays local) until it is remounted", self.tier.name,
                  where(self.tier), why)

    def release(self) -> None:
        """Mark the lease released (clean unmount), if it is still ours. Best effort, with
        the heartbeat's retries."""
        with self._lock:
            if not self.held:
                return
            self.held = False
        try:
            released = self.retrying("release", self._release)
        except TierError as exc:
            log.warning("could not release the writer lease of remote tier %s (%s); it expires "
                        "%.0f s after the last heartbeat", self.tier.name, exc,
                        self.timing.timeout_s)
            return
        if released:
            log.info("released the writer lease of remote tier %s", self.tier.name)

    def _release(self) -> bool:
        """Write our lease as released over the one read just before (False: it is not
        ours any more)."""
        for _ in range(_ACQUIRE_ROUNDS):
            state = self._mine()
            if state is None:
                return False
            try:
                self._write(replace(self.me, heartbeat=self.clock(), released=True), state.etag)
            except PreconditionFailed:
                continue  # written since we read it: look again
            return True
        raise TransientLeaseError(f"tier {self.tier.name}: the lease kept changing while "
                                  "releasing it")


class _Beats:
    """Tells a lease's watchdog that one of its heartbeats ended (the deadline may have
    moved). Trio thread only."""

    def __init__(self) -> None:
        self.ended = trio.Event()

    def end(self) -> None:
        self.ended.set()
        self.ended = trio.Event()


class WriterLeases:
    """The writer leases of a mount, one per remote tier."""

    def __init__(
        self, remotes: Sequence[S3Tier], state_dir: Path, *, takeover: bool = False,
        timing: LeaseTiming | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.timing = timing or lease_timing()
        wid = writer_id(state_dir)
        assert wid is not None
        me = Lease(writer_id=wid, host=socket.gethostname(), pid=os.getpid(),
                   state_dir=str(state_dir), heartbeat=0.0)
        self.leases = [WriterLease(t, me, self.timing, takeover=takeover, monotonic=monotonic,
                                   sleep=sleep) for t in remotes]
        # One heartbeat thread per remote: a hung remote holds back no other's heartbeat.
        self._limiter = trio.CapacityLimiter(max(1, len(remotes)))

    def acquire(self, later: Collection[str] = ()) -> None:
        """At mount, before anything is written: take every lease. LeaseConflict (after
        releasing the ones taken) refuses the mount; a remote still unreachable after the
        heartbeat's retries only fences its tier until the heartbeat task can take the
        lease. The tiers named in ``later`` (no answer at mount) are not asked now: the
        mount never waits for a hung remote; the heartbeat task takes their leases (a
        conflict found then fences the tier, as a takeover elsewhere does)."""
        for lease in self.leases:
            if lease.tier.name in later:
                lease.tier.fence("the writer lease of this prefix is not taken yet (the "
                                 "remote did not answer at mount)")
                log.warning("writer lease of remote tier %s not taken yet (not reachable at "
                            "mount); uploads to it wait until it is", lease.tier.name)
                lease.failing = True
                continue
            try:
                lease.retrying("mount", lease.acquire)
            except LeaseConflict:
                self.release()
                raise
            except TierError as exc:
                lease.tier.fence(f"the writer lease of this prefix is not taken yet ({exc})")
                log.warning("writer lease of remote tier %s not taken (%s); uploads to it wait "
                            "until it is", lease.tier.name, exc)
                lease.failing = True

    async def run(self, on_writable: Callable[[str], Awaitable[None]] | None = None) -> None:
        """A task in the mount's nursery, cancelled at unmount: for every remote, its
        heartbeat and its watchdog, in a nursery of this task. ``on_writable(tier)``: a
        heartbeat lifted the tier's fence (the lease is held again, or taken at last after
        a mount that could not reach the remote): the writes held meanwhile may go now."""
        async with trio.open_nursery() as nursery:
            for lease in self.leases:
                beats = _Beats()
                nursery.start_soon(self._watchdog, lease, beats)
                nursery.start_soon(self._heartbeats, lease, beats, on_writable)

    async def _heartbeats(
        self, lease: WriterLease, beats: _Beats,
        on_writable: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        """A heartbeat every ``heartbeat_s``, from the start of one to the start of the
        next (one that took longer is followed at once). The first runs at once (setup,
        such as a catalog restore, may have taken a while)."""
        while True:
            due = trio.current_time() + self.timing.heartbeat_s
            fenced = lease.tier.fenced
            try:
                await trio.to_thread.run_sync(lease.heartbeat, limiter=self._limiter)
            except Exception:  # a bug here must not take the mount down
                log.exception("writer lease heartbeat of tier %s failed", lease.tier.name)
            beats.end()
            if fenced is not None and lease.tier.fenced is None and on_writable is not None:
                try:
                    await on_writable(lease.tier.name)
                except CkptfsError as exc:  # the backoff timers still retry them
                    log.warning("tier %s writable again, but its held uploads could not be "
                                "made due now: %s", lease.tier.name, exc)
            await trio.sleep_until(due)  # a real period: the lease's heartbeat

    async def _watchdog(self, lease: WriterLease, beats: _Beats) -> None:
        """Fence the tier at ``renewed_at + window_s`` if no renewal came by then, even
        while a heartbeat hangs in a request (a deadline, moved by each heartbeat's end)."""
        while True:
            ended = beats.ended
            seen, left = lease.deadline()
            with trio.move_on_at(trio.current_time() + left) as scope:
                await ended.wait()
            if scope.cancelled_caught:
                lease.expire(seen)  # unless a renewal came meanwhile
                await ended.wait()

    def release(self) -> None:
        for lease in self.leases:
            lease.release()


def describe_holder(state: LeaseState, now: float) -> str:
    if state.lease is None:
        return str(state.problem or "no lease")
    return state.lease.describe(now) + (" (released)" if state.lease.released else "")
