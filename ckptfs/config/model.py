"""The configuration model: frozen, typed dataclasses, one per component that consumes
them, composed by ``Config``. Pure data: this module imports nothing of ckptfs, so every
layer may import it (an import-linter contract in pyproject.toml holds it to that).

The TOML keys and their checks live in load.py; ``Config`` is what they produce.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# Chosen by measurement (docs/performance.md, chunk-size sweep): 16 MiB was the fastest or
# near-fastest size for every write and read test; smaller chunks pay per-chunk costs (a
# thread hop, a frame file create + rename + fsync, a catalog row) that show, and 32 MiB
# was no faster. A partial-chunk read-modify-write of 16 MiB still takes only milliseconds.
DEFAULT_CHUNK_SIZE = 16 * MiB
DEFAULT_MEMORY_BUDGET = 1 * GiB
DEFAULT_IO_THREADS = 4
# Six 16 MiB chunks in flight per sequential reader: two (32 MiB) left a cold read waiting
# on each device read (performance-history.md, "Write and read path").
DEFAULT_READAHEAD = 96 * MiB
# GETs from the remote tiers in flight at once (reads, readahead, prefetch): enough to fill
# the link (its bandwidth-delay product), measured in performance-history.md ("Restore from the
# bucket"); the S3 connection pool is sized to hold them besides the uploads.
DEFAULT_REMOTE_READ_CONCURRENCY = 8
# Tens of seconds: a node that just committed a chunk uploads it within that time unless
# its uploads are deferred behind a long save or the node is gone (docs/multinode.md).
DEFAULT_PEER_CHUNK_WAIT_S = 30.0
MIN_CHUNK_SIZE = 64 * KiB
MAX_CHUNK_SIZE = 64 * MiB
# Prometheus metrics (ckptfs/metrics.py): localhost only unless configured otherwise.
DEFAULT_METRICS_ADDRESS = "127.0.0.1:9464"

# The files of a state dir (the catalog engine opens CATALOG_FILE; the daemon logs to LOG_FILE).
CATALOG_FILE = "catalog.sqlite"
# The embedded catalog engine's name in the `catalog` key; any other value is a PostgreSQL URI.
SQLITE_CATALOG = "sqlite"
CATALOG_SCHEMES = ("postgresql", "postgres")
# Connections per node to a shared catalog (PostgreSQL); the daemon's catalog limiter has as
# many slots, so this many catalog transactions of one node run at once.
DEFAULT_CATALOG_POOL_SIZE = 4
LOG_FILE = "ckptfs.log"

# The choices of the keys that take one, as types and as the tuples the checks list.
VerifyWrites = Literal["memory", "device"]
VERIFY_WRITES: tuple[VerifyWrites, ...] = get_args(VerifyWrites)
AddressingStyle = Literal["path", "virtual", "auto"]
ADDRESSING_STYLES: tuple[AddressingStyle, ...] = get_args(AddressingStyle)
# lz4 for the copy sent to a remote tier (ckptfs/codec/compress.py): "auto" compresses a
# chunk only when a sample says it pays, "off" never, "always" whenever it is smaller.
RemoteCompression = Literal["auto", "off", "always"]
REMOTE_COMPRESSION_MODES: tuple[RemoteCompression, ...] = get_args(RemoteCompression)
# Uploads while a save writes (upload/uploader.py): "defer" waits for the save to end,
# "overlap" runs them at full concurrency, "auto" uses what the save leaves spare.
UploadDuringSave = Literal["auto", "defer", "overlap"]
UPLOAD_DURING_SAVE: tuple[UploadDuringSave, ...] = get_args(UploadDuringSave)
CopyBack = Literal["sequential", "always", "never"]
COPY_BACK: tuple[CopyBack, ...] = get_args(CopyBack)
OnLocalFull = Literal["block", "enospc"]
ON_LOCAL_FULL: tuple[OnLocalFull, ...] = get_args(OnLocalFull)
# fsync of each chunk frame as soon as it is written (chunks/store.py, write-behind).
WriteBehind = Literal["auto", "always", "never"]
WRITE_BEHIND: tuple[WriteBehind, ...] = get_args(WriteBehind)
Durability = Literal["local", "remote"]
DURABILITIES: tuple[Durability, ...] = get_args(Durability)


# --------------------------------------------------------------------------- tiers/


@dataclass(frozen=True)
class TierConfig:
    """A local tier: a directory standing for one device."""

    name: str
    kind: str  # always "local"; remote tiers are S3TierConfig
    path: Path
    location: str = "local"
    weight: float = 1.0
    capacity: int | None = None  # optional cap in bytes; None means the device's free space
    # A missing directory is refused (an unmounted device would fill the disk below it)
    # unless ``create``; two tiers on one device are refused unless both allow it.
    create: bool = False
    allow_shared_device: bool = False
    # Large frames written with O_DIRECT from reused buffers where the filesystem takes it
    # (tiers/direct.py); "device" also reads every frame back from the device to check it.
    direct_io: bool = True
    verify_writes: VerifyWrites = "memory"
    # Where the tier came from, for error messages: "tier[2]", "--local", "recorded", "default".
    origin: str = field(default="", compare=False)


@dataclass(frozen=True)
class S3TierConfig:
    """A remote tier in an S3 bucket. Objects live at ``<prefix>/chunks/<digest>``.

    Credentials come from the standard AWS chain (environment, shared config and
    credentials files, ``profile``), never from this file.
    """

    name: str
    bucket: str
    prefix: str = ""  # no leading or trailing "/"; "" means the bucket root
    endpoint_url: str | None = None  # None: the AWS endpoint for ``region``
    region: str = "us-east-1"
    addressing_style: AddressingStyle = "path"
    verify_tls: bool = True
    profile: str | None = None
    location: str = "remote"
    weight: float = 1.0
    kind: str = field(default="s3", init=False)


# --------------------------------------------------------------------------- vfs/ (commits)


@dataclass(frozen=True)
class DurabilityPolicy:
    """Files under ``path`` (absolute inside the mount) commit with this durability:
    "local" (close/fsync return once the local tiers hold the data) or "remote" (they also
    wait, up to ``timeout_s``, until the remote tiers hold it and it is recoverable)."""

    path: str
    durability: Durability
    timeout_s: float = 600.0

    def covers(self, path: str) -> bool:
        return self.path == "/" or path == self.path or path.startswith(self.path + "/")


def policy_for(policies: tuple[DurabilityPolicy, ...], path: str) -> DurabilityPolicy | None:
    """The policy with the longest path that covers ``path`` (None: the default, local)."""
    best = None
    for p in policies:
        if p.covers(path) and (best is None or len(p.path) > len(best.path)):
            best = p
    return best


# --------------------------------------------------------------------------- checkpoints/

PATTERN_COMMITS = ("rename", "quiescence")  # plus "file:NAME"
DEFAULT_QUIET_S = 30.0


@dataclass(frozen=True)
class PatternConfig:
    """A ``[[checkpoint_pattern]]`` table: roots matching ``glob`` (fnmatch on the whole
    path inside the mount, as retention policies: ``*`` also matches ``/``) commit by
    ``commit``: "file:NAME", "rename" or "quiescence" (after ``quiet_s``)."""

    glob: str
    commit: str
    quiet_s: float = DEFAULT_QUIET_S
    framework: str = "pattern"


@dataclass(frozen=True)
class RetentionPolicy:
    """A ``[[retention]]`` table (checkpoints/retention.py plans with it)."""

    glob: str  # run directories (inside the mount) this policy covers, fnmatch syntax
    # A named class (``name``, no ``path``) applies only where a [[namespace]] names it.
    name: str | None = None
    keep_local: int = 2
    keep: int = 5
    milestone_every: int = 0
    keep_milestones: int = 0  # 0: every milestone
    max_age_s: float | None = None
    skip_superseded_uploads: bool = True

    def covers(self, run: str) -> bool:
        return fnmatch.fnmatchcase(run, self.glob)


# --------------------------------------------------------------------------- components


@dataclass(frozen=True)
class StoreConfig:
    """The chunk store and the write path's memory (chunks/store.py, vfs/openfile.py)."""

    chunk_size: int = DEFAULT_CHUNK_SIZE
    # The config or --chunk-size named chunk_size (a default that differs from an
    # existing catalog's is no reason to warn).
    chunk_size_set: bool = False
    # Chunk buffers of files being written; half as much again is the decoded-chunk cache.
    memory_budget: int = DEFAULT_MEMORY_BUDGET
    io_threads: int = DEFAULT_IO_THREADS
    remote_copies: int = 1  # how many remote tiers hold each chunk (its upload jobs)
    # When the local tiers are full of chunks not yet on a remote: wait for uploads to
    # free room (backpressure, at most local_full_timeout_s) or fail at once with ENOSPC.
    on_local_full: OnLocalFull = "block"
    local_full_timeout_s: float = 600.0
    write_behind: WriteBehind = "never"


@dataclass(frozen=True)
class UploadConfig:
    """The upload queue to the remote tiers (upload/uploader.py)."""

    concurrency: int = 8  # uploads in flight at once (upload_concurrency)
    during_save: UploadDuringSave = "auto"  # upload_during_save
    compression: RemoteCompression = "auto"  # remote_compression


@dataclass(frozen=True)
class ReadConfig:
    """The read path (vfs/openfile.py, chunks/store.py): bytes fetched ahead of each
    sequential reader (0: none), and when a chunk read from a remote tier only is written
    to a local tier too."""

    readahead: int = DEFAULT_READAHEAD
    copy_back: CopyBack = "sequential"
    remote_concurrency: int = DEFAULT_REMOTE_READ_CONCURRENCY  # remote_read_concurrency
    # A shared catalog: how long a read of a chunk that only another node's local tiers
    # hold waits for that node to upload it, before EIO (peer_chunk_wait).
    peer_wait_s: float = DEFAULT_PEER_CHUNK_WAIT_S
    # Chunks fetched ahead of a reader are written into the kernel's page cache from a
    # worker thread (vfs/pagepush.py; page_cache_push; never with a shared catalog).
    page_cache_push: bool = True


@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpoint awareness (checkpoints/detectors.py, tracker.py; docs/checkpoints.md)."""

    enabled: bool = True  # the ``checkpoints`` key
    partial_after_s: float = 600.0  # checkpoint_partial_after
    patterns: tuple[PatternConfig, ...] = ()  # [[checkpoint_pattern]]


@dataclass(frozen=True)
class RetentionConfig:
    """What the janitor keeps, evicts and expires (checkpoints/janitor.py)."""

    policies: tuple[RetentionPolicy, ...] = ()  # [[retention]]
    local_high_watermark: float = 0.9


DEFAULT_SESSION_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class CatalogConfig:
    """Where the namespace lives (ckptfs/catalog): the embedded SQLite file of the state
    dir (one node), or a PostgreSQL database that several nodes share (docs/multinode.md)."""

    url: str = SQLITE_CATALOG  # catalog: "sqlite" or a libpq URI postgresql://USER@HOST/DB
    url_set: bool = False  # the config or --catalog named it (else a state dir's binding applies)
    node: str = ""  # node: this node's name in a shared catalog (load fills in the host name)
    node_set: bool = False  # the config or --node named it
    pool_size: int = DEFAULT_CATALOG_POOL_SIZE  # catalog_pool_size
    # session_timeout: a shared catalog's node session expires this long after its last
    # heartbeat (every fifth of it); then a live node cleans up after it (docs/multinode.md).
    session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S

    @property
    def heartbeat_s(self) -> float:
        return self.session_timeout_s / 5

    @property
    def shared(self) -> bool:
        """Several nodes may use this catalog at once."""
        return self.url != SQLITE_CATALOG


@dataclass(frozen=True)
class FuseConfig:
    """The FUSE mount options (mount.fuse_options)."""

    allow_other: bool = False  # config_from_dict: on by default when running as root
    # The kernel checks permissions from the mode bits (FUSE default_permissions); off
    # only for a single-user mount, since ckptfs itself checks no access.
    default_permissions: bool = True


@dataclass(frozen=True)
class MetricsConfig:
    """Prometheus metrics (metrics.py): "HOST:PORT" to listen on ("" disables; port 0
    picks a free one)."""

    address: str = DEFAULT_METRICS_ADDRESS  # metrics_address


@dataclass(frozen=True)
class ScrubConfig:
    """The scrubber ([scrub], ckptfs/scrub/): every copy of every chunk read and verified
    at ``rate`` bytes/s, oldest check first, each copy again once ``interval_s`` has passed
    since its last check; ``pause_while_writing``: it waits while a save's chunks are in
    memory; ``enabled`` false: only `ckptfs scrub` runs a pass."""

    enabled: bool = True
    rate: int = 32 * 1024 * 1024
    interval_s: float = 7 * 86400.0
    pause_while_writing: bool = True


# --------------------------------------------------------------------------- governance
# (docs/governance.md): namespaces, access, residency, keys, audit.


@dataclass(frozen=True)
class NamespaceConfig:
    """A ``[[namespace]]`` table: the directory subtree ``path`` (absolute inside the mount,
    normalised, never "/") belongs to one project. Its owners are ``uids`` and members of
    ``gids``; every copy of its chunks stays on tiers whose ``location`` is in
    ``allowed_locations`` (None: anywhere); ``encrypt`` encrypts its chunks on every tier;
    ``quota`` caps its bytes (None: no cap); ``retention`` names a ``[[retention]]`` class
    that covers its run directories."""

    path: str
    uids: tuple[int, ...] = ()
    gids: tuple[int, ...] = ()
    allowed_locations: tuple[str, ...] | None = None
    encrypt: bool = False
    quota: int | None = None
    retention: str | None = None
    # An encrypted namespace's end (ns since the epoch, ``expires``): its keys are shredded
    # then, which makes all its data unreadable on every tier (docs/governance.md).
    expires_ns: int | None = None
    origin: str = field(default="", compare=False)  # "namespace[2]", for messages
    # The root directory made at mount when missing (``owner``, ``group``, ``mode``;
    # daemon/provision.py): None where the config gave no owners (a recorded rule).
    root_uid: int | None = None
    root_gid: int | None = None
    root_mode: int | None = None

    def covers(self, path: str) -> bool:
        return path == self.path or path.startswith(self.path + "/")

    def allows_location(self, location: str) -> bool:
        return self.allowed_locations is None or location in self.allowed_locations

    def owned_by(self, uid: int, gids: frozenset[int]) -> bool:
        """``uid`` (with primary and supplementary groups ``gids``) is one of its owners."""
        return uid in self.uids or not gids.isdisjoint(self.gids)


# Paths outside every [[namespace]]: the default namespace, with POSIX rules only.
DEFAULT_NAMESPACE = NamespaceConfig(path="/", origin="default")


@dataclass(frozen=True)
class KeysConfig:
    """``[keys]``: where the key-encryption key comes from: a file of 32 random bytes (mode
    0600, outside the state dir) or a command that prints them (a KMS hook). Exactly one of
    the two; both None when no namespace is encrypted."""

    kek_file: Path | None = None
    kek_command: str | None = None

    @property
    def configured(self) -> bool:
        return self.kek_file is not None or self.kek_command is not None


DEFAULT_SEAL_INTERVAL_S = 3600.0
DEFAULT_REFUSAL_WINDOW_S = 60.0


@dataclass(frozen=True)
class AuditConfig:
    """``[audit]``: the Ed25519 private key that signs the head of the audit chain (a key
    file outside the state dir; None: heads are not signed), how often a seal is made, and
    the window that aggregates refused access."""

    signing_key_file: Path | None = None
    seal_interval_s: float = DEFAULT_SEAL_INTERVAL_S
    # Refused access is recorded once per (uid, namespace, operation) per this many seconds,
    # with a count (vfs/refusals.py).
    refusal_window_s: float = DEFAULT_REFUSAL_WINDOW_S


@dataclass(frozen=True)
class GovernanceConfig:
    """Namespaces, the admin groups (``[access] admin_gids``: members may cross namespaces,
    audited; root is not exempt otherwise), keys and audit."""

    namespaces: tuple[NamespaceConfig, ...] = ()
    admin_gids: tuple[int, ...] = ()
    keys: KeysConfig = field(default_factory=KeysConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)

    def namespace_for(self, path: str) -> NamespaceConfig:
        """The namespace of ``path`` (absolute inside the mount); namespaces never nest."""
        for ns in self.namespaces:
            if ns.covers(path):
                return ns
        return DEFAULT_NAMESPACE

    def is_admin(self, gids: frozenset[int]) -> bool:
        return not gids.isdisjoint(self.admin_gids)

    @property
    def enabled(self) -> bool:
        return bool(self.namespaces)


# --------------------------------------------------------------------------- Config


@dataclass(frozen=True)
class DrillConfig:
    """``[drill]``: restore drills (ckptfs/drill/, docs/operations.md "Restore drills").
    ``runs``: run directories (paths inside the mount) drilled by ``ckptfs drill`` with no
    argument and, every ``interval_s`` (0: never; the systemd timer asks instead), by the
    daemon itself; ``bandwidth``: bytes/s a drill reads from the remote (0: no cap);
    ``scratch``: where the restored files go, removed after the check (None:
    STATE_DIR/drill)."""

    interval_s: float = 0.0
    runs: tuple[str, ...] = ()
    bandwidth: int = 0
    scratch: Path | None = None


@dataclass(frozen=True)
class Config:
    """A mount's configuration: where its state lives, its tiers, and each component's
    part. The composition root (mount.py) hands each component its own part."""

    state_dir: Path
    tiers: tuple[TierConfig, ...]  # local tiers: new chunks land here
    remote_tiers: tuple[S3TierConfig, ...] = ()  # remote tiers: the uploader copies chunks here
    store: StoreConfig = field(default_factory=StoreConfig)
    upload: UploadConfig = field(default_factory=UploadConfig)
    reads: ReadConfig = field(default_factory=ReadConfig)
    checkpoints: CheckpointConfig = field(default_factory=CheckpointConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    policies: tuple[DurabilityPolicy, ...] = ()  # per-directory durability (the VFS's commits)
    fuse: FuseConfig = field(default_factory=FuseConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    scrub: ScrubConfig = field(default_factory=ScrubConfig)
    catalog: CatalogConfig = field(default_factory=CatalogConfig)
    governance: GovernanceConfig = field(default_factory=GovernanceConfig)
    drill: DrillConfig = field(default_factory=DrillConfig)
    source: str = field(default="<embedded default>", compare=False)

    @property
    def catalog_path(self) -> Path:
        return self.state_dir / CATALOG_FILE

    @property
    def log_path(self) -> Path:
        return self.state_dir / LOG_FILE

    @property
    def drill_scratch(self) -> Path:
        return self.drill.scratch if self.drill.scratch is not None else self.state_dir / "drill"
