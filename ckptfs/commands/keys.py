"""`ckptfs rekey` and `ckptfs shred` (docs/governance.md, "Encryption at rest and keys"):
key changes in the catalog, beside a running daemon or not. A daemon learns of them from
the catalog within a second (keys/ring.py), on every node sharing it.

* ``rekey --namespace PATH``: a new version of that namespace's data key; new chunks are
  sealed with it, old ones stay readable with theirs.
* ``rekey --new-kek-file F``: every live key version wrapped by the KEK in F instead
  (one transaction); afterwards mount with ``kek_file = F``.
* ``shred PATH --yes``: destroy every key version of the namespace at PATH: every copy
  of its chunks on every tier is unreadable from then on. With remote tiers, waits for a
  catalog snapshot taken after the shred (the bucket's older snapshot held the wrapped
  keys; the new one replaces it).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

from ..catalog.audit import AuditRecord
from ..catalog.durability import snapshot_covers
from ..catalog.engines import open_state_dir_catalog
from ..config import Config
from ..config.model import KeysConfig
from ..errors import UsageError
from ..keys.kek import kek_id, load_kek
from ..keys.ring import rewrap_all, rotate
from .live import remote_tier_names

log = logging.getLogger("ckptfs.keys")

SNAPSHOT_POLL_S = 0.2


def cmd_rekey(cfg: Config, namespace: str | None, new_kek_file: str | None) -> int:
    if namespace is None and new_kek_file is None:
        raise UsageError("rekey: give --namespace PATH (a new data key version) and/or "
                         "--new-kek-file FILE (rewrap every key under a new KEK)")
    kek = load_kek(cfg.governance.keys)
    catalog = open_state_dir_catalog(cfg.state_dir, readonly=False)
    try:
        if namespace is not None:
            if namespace not in {ns.path for ns in cfg.governance.namespaces if ns.encrypt}:
                raise UsageError(f"rekey --namespace: {namespace} is not an encrypted "
                                 f"namespace of the config")
            row = rotate(catalog, kek, namespace)
            catalog.audit_append(AuditRecord(
                "key_rotate", namespace, os.getuid(), os.getpid(),
                detail={"version": row.version, "key_id": row.key_id}))
            log.info("namespace %s: key rotated to version %d (key id %d)", namespace,
                     row.version, row.key_id)
            print(f"ckptfs rekey: namespace {namespace} now seals new chunks with key "
                  f"version {row.version} (key id {row.key_id}); older versions stay readable")
        if new_kek_file is not None:
            new_kek = load_kek(KeysConfig(kek_file=Path(new_kek_file).absolute()))
            n = rewrap_all(catalog, kek, new_kek)
            catalog.audit_append(AuditRecord(
                "key_rewrap", "/", os.getuid(), os.getpid(),
                detail={"keys": n, "kek": kek_id(new_kek), "was": kek_id(kek)}))
            log.info("every live namespace key (%d) rewrapped under KEK %s (was %s)", n,
                     kek_id(new_kek), kek_id(kek))
            print(f"ckptfs rekey: {n} key version(s) rewrapped under the new KEK "
                  f"(fingerprint {kek_id(new_kek)}); set keys.kek_file = {new_kek_file!r}")
        return 0
    finally:
        catalog.close()


def cmd_shred(cfg: Config, namespace: str, yes: bool, timeout: float) -> int:
    if not yes:
        raise UsageError(f"shred: destroys every key of namespace {namespace}: all its data on "
                         f"every tier becomes unreadable, for good; add --yes to do it")
    catalog = open_state_dir_catalog(cfg.state_dir, readonly=False)
    try:
        rows = catalog.namespace_keys(namespace)
        if not rows:
            raise UsageError(f"shred: namespace {namespace} has no keys in the catalog")
        at = time.time_ns()
        ids = catalog.shred_namespace_keys(namespace)
        catalog.audit_append(AuditRecord("shred", namespace, os.getuid(), os.getpid(),
                                         detail={"key_ids": ids}))
        log.info("namespace %s: shredded key ids %s", namespace, ", ".join(map(str, ids)) or "none")
        print(f"ckptfs shred: namespace {namespace}: {len(ids)} key version(s) destroyed; "
              f"its chunks can no longer be read on any tier")
        if not remote_tier_names(catalog):
            return 0
        deadline = time.monotonic() + timeout
        while not snapshot_covers(catalog, at):
            if time.monotonic() >= deadline:
                print(f"ckptfs shred: the remote catalog snapshot was not retaken within "
                      f"{timeout:.0f} s (is the daemon running?); until it is, the bucket's "
                      f"snapshot still holds the wrapped keys", file=sys.stderr)
                return 1
            time.sleep(SNAPSHOT_POLL_S)  # the daemon uploads it in its own process
        print("ckptfs shred: the remote catalog snapshot no longer holds them")
        return 0
    finally:
        catalog.close()

