"""Configuration: TOML loaded into frozen dataclasses, validated strictly.

model.py is the model (one dataclass per component, ``Config`` composing them; it imports
nothing of ckptfs); load.py reads the file and the command-line overrides into it, with
parse.py (sizes, seconds, choices), tiers.py (``[[tier]]``, ``--remote``, ``--local``) and
checkpoints.py (``[[checkpoint_pattern]]``, ``[[retention]]``) and governance.py
(``[[namespace]]``, ``[access]``, ``[keys]``, ``[audit]``). The names below are the
package's surface.
"""

from .checkpoints import patterns_from_config, policies_from_config
from .governance import check_governance
from .load import (
    RecordedTiers,
    config_from_dict,
    default_node,
    default_state_dir,
    load_config,
    parse_catalog_url,
    parse_node,
)
from .model import (
    ADDRESSING_STYLES,
    CATALOG_FILE,
    DEFAULT_CHUNK_SIZE,
    DEFAULT_IO_THREADS,
    DEFAULT_MEMORY_BUDGET,
    DEFAULT_METRICS_ADDRESS,
    DEFAULT_NAMESPACE,
    DEFAULT_READAHEAD,
    DEFAULT_REMOTE_READ_CONCURRENCY,
    MAX_CHUNK_SIZE,
    MIN_CHUNK_SIZE,
    REMOTE_COMPRESSION_MODES,
    SQLITE_CATALOG,
    UPLOAD_DURING_SAVE,
    AuditConfig,
    CatalogConfig,
    CheckpointConfig,
    Config,
    DurabilityPolicy,
    FuseConfig,
    GiB,
    GovernanceConfig,
    KeysConfig,
    KiB,
    MetricsConfig,
    MiB,
    NamespaceConfig,
    PatternConfig,
    ReadConfig,
    RetentionConfig,
    RetentionPolicy,
    S3TierConfig,
    StoreConfig,
    TierConfig,
    UploadConfig,
    policy_for,
)
from .parse import array_of_tables, parse_metrics_address, parse_size
from .tiers import local_tiers_from_paths, parse_remote_url

__all__ = [
    "ADDRESSING_STYLES", "AuditConfig", "CATALOG_FILE", "DEFAULT_NAMESPACE", "GovernanceConfig",
    "KeysConfig", "NamespaceConfig", "check_governance", "SQLITE_CATALOG", "DEFAULT_CHUNK_SIZE", "DEFAULT_IO_THREADS",
    "DEFAULT_MEMORY_BUDGET", "DEFAULT_METRICS_ADDRESS", "DEFAULT_READAHEAD",
    "DEFAULT_REMOTE_READ_CONCURRENCY", "MAX_CHUNK_SIZE",
    "MIN_CHUNK_SIZE", "REMOTE_COMPRESSION_MODES", "UPLOAD_DURING_SAVE", "CatalogConfig", "CheckpointConfig",
    "Config", "DurabilityPolicy", "FuseConfig", "GiB", "KiB", "MetricsConfig", "MiB",
    "PatternConfig", "ReadConfig", "RecordedTiers", "RetentionConfig", "RetentionPolicy",
    "S3TierConfig", "StoreConfig", "TierConfig", "UploadConfig", "array_of_tables", "config_from_dict",
    "default_state_dir", "default_node", "load_config", "parse_catalog_url",
    "parse_node", "local_tiers_from_paths", "parse_metrics_address",
    "parse_remote_url", "parse_size", "patterns_from_config", "policies_from_config",
    "policy_for",
]
