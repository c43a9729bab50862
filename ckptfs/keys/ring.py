"""The daemon's keys: made where missing, unwrapped at mount, kept current.

At mount (``NamespaceKeys.load``, blocking: before the trio loop or in a worker thread)
every encrypted namespace of the config gets its key if it has none (one transaction per
namespace: with a shared catalog the first node creates it, the others use it), then every
live key version in the catalog is unwrapped with the KEK into the process's keyring
(codec/seal.py): versions of namespaces no longer configured as encrypted too, so what
they sealed stays readable. Keys are in memory only.

Another node's rotation or shred (or ``ckptfs rekey``/``shred`` beside this daemon)
changes ``keys_gen`` in the catalog; ``run`` looks at it every KEYS_RECHECK_S (no event
crosses processes or nodes) and reloads: new versions are unwrapped, shredded ones
forgotten, and the chunk cache drops plaintext they sealed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import trio

from ..catalog.audit import AuditRecord
from ..catalog.keys import KeyRow
from ..catalog.protocols import AuditCatalog, KeyCatalog
from ..codec.seal import KEYRING, SealKey
from ..config.model import GovernanceConfig
from ..errors import CkptfsError, UsageError
from .kek import kek_id, load_kek
from .wrap import new_key_material, unwrap, wrap

log = logging.getLogger("ckptfs.keys")

KEYS_RECHECK_S = 1.0


def fresh_wrap(kek: bytes) -> Callable[[str, int], tuple[bytes, str]]:
    """A wrap function for a namespace's first key version (new data and id keys)."""
    return lambda ns, version: (wrap(kek, ns, version, *new_key_material()), kek_id(kek))


def live_keys(kek: bytes, rows: Sequence[KeyRow]) -> list[SealKey]:
    return [unwrap(kek, r) for r in rows if not r.shredded]


def rotate(catalog: KeyCatalog, kek: bytes, namespace: str) -> KeyRow:
    """A new version of ``namespace``'s data key (its id key stays: chunk ids, and so
    deduplication within the namespace, do not change with a rotation)."""
    keys = live_keys(kek, catalog.namespace_keys(namespace))
    if not keys:
        made = catalog.ensure_namespace_key(namespace, fresh_wrap(kek))
        if made is not None:
            return made
        keys = live_keys(kek, catalog.namespace_keys(namespace))
    id_key = keys[-1].id_key
    return catalog.rotate_namespace_key(
        namespace,
        lambda ns, version: (wrap(kek, ns, version, new_key_material()[0], id_key), kek_id(kek)),
    )


def rewrap_all(catalog: KeyCatalog, old_kek: bytes, new_kek: bytes) -> int:
    """Every live key version wrapped by ``new_kek`` instead (one transaction)."""

    def again(row: KeyRow) -> tuple[bytes, str]:
        k = unwrap(old_kek, row)
        return wrap(new_kek, row.namespace, row.version, k.data_key, k.id_key), kek_id(new_kek)

    return catalog.rewrap_keys(again)


def load_keyring(catalog: KeyCatalog, gov: GovernanceConfig) -> int:
    """A command that reads frames (fsck --verify): every live key into the keyring.
    UsageError if the catalog holds keys and the config names no KEK (every sealed frame
    would look corrupt, and a repair would drop good copies)."""
    rows = [r for r in catalog.namespace_keys() if not r.shredded]
    if not rows:
        return 0
    if not gov.keys.configured:
        raise UsageError("the catalog holds encrypted namespaces' keys: give the config "
                         "with [keys] kek_file or kek_command, so their chunks can be checked")
    keys = live_keys(load_kek(gov.keys), rows)
    KEYRING.replace(keys)
    return len(keys)


class RingCatalog(KeyCatalog, AuditCatalog, Protocol):
    """What the keys read and record: the key rows, and the audit of their changes."""


class NamespaceKeys:
    """The keys of one daemon: its KEK (memory only) and the encrypted namespaces of its
    config."""

    def __init__(self, catalog: RingCatalog, gov: GovernanceConfig,
                 clock: Callable[[], int] = time.time_ns, *,
                 on_change: Callable[[], None] | None = None) -> None:
        """``on_change``: the keys changed (the catalog's on_touch hook: the bucket's
        snapshot is retaken soon)."""
        self.catalog = catalog
        self.on_change = on_change
        self.namespaces = tuple(ns.path for ns in gov.namespaces if ns.encrypt)
        # Namespaces that end (``expires``): their keys are shredded at that time.
        self.expires = {ns.path: ns.expires_ns for ns in gov.namespaces
                        if ns.encrypt and ns.expires_ns is not None}
        self.clock = clock
        self._kek = load_kek(gov.keys)  # ConfigError naming the key: the mount exits 2
        self.gen = -1
        self._shredded: set[str] = set()  # expired namespaces this daemon has shredded

    def expired(self) -> list[str]:
        now = self.clock()
        return [ns for ns, at in self.expires.items() if at <= now]

    def shred_expired(self) -> list[int]:
        """Blocking: shred the keys of namespaces past their ``expires`` (idempotent: every
        node may do it; the first one's shred is the one that counts)."""
        gone: list[int] = []
        for ns in self.expired():
            if all(r.shredded for r in self.catalog.namespace_keys(ns)):
                continue  # done already (here or by another node): change nothing
            ids = self.catalog.shred_namespace_keys(ns)
            if ids:
                self.catalog.audit_append(AuditRecord(
                    "shred", ns, 0, 0, detail={"key_ids": ids, "reason": "expires"}))
                log.info("namespace %s expired: its key ids %s shredded (all its data is "
                         "unreadable from now on)", ns, ", ".join(map(str, ids)))
            gone += ids
        return gone

    def load(self) -> set[int]:
        """Blocking: make missing keys, unwrap every live one into the keyring; returns
        the key ids forgotten (shredded since the last load). ConfigError if a key does not
        unwrap with this KEK."""
        self.shred_expired()
        expired = set(self.expired())
        for ns in self.namespaces:
            if ns in expired:
                continue  # no new key: writes there fail (EIO) from now on
            made = self.catalog.ensure_namespace_key(ns, fresh_wrap(self._kek))
            if made is not None:
                self.catalog.audit_append(AuditRecord(
                    "key_create", ns, 0, 0, detail={"version": made.version,
                                                     "key_id": made.key_id}))
                log.info("namespace %s: key version %d created (key id %d)", ns, made.version,
                         made.key_id)
        gen = self.catalog.keys_gen()
        rows = self.catalog.namespace_keys()
        keys = live_keys(self._kek, rows)
        gone = KEYRING.replace(keys)
        self.gen = gen
        if gone:
            log.info("key ids %s shredded in the catalog: forgotten by this node",
                     ", ".join(map(str, sorted(gone))))
        log.info("keys loaded: %d live key version(s) of %d namespace(s)", len(keys),
                 len({k.namespace for k in keys}))
        return gone

    async def run(self, db_limiter: trio.CapacityLimiter, forget: Callable[[set[int]], None]) -> None:
        """Follow the catalog's key changes (see the module's docstring)."""
        while True:
            await trio.sleep(KEYS_RECHECK_S)
            try:
                if any(ns not in self._shredded for ns in self.expired()):
                    await trio.to_thread.run_sync(self.shred_expired, limiter=db_limiter)
                    self._shredded.update(self.expired())
                gen = await trio.to_thread.run_sync(self.catalog.keys_gen, limiter=db_limiter)
            except CkptfsError as exc:
                log.warning("could not read the namespace keys' generation: %s", exc)
                continue
            if gen == self.gen:
                continue
            try:
                gone = await trio.to_thread.run_sync(self.load, limiter=db_limiter)
            except CkptfsError as exc:
                self.gen = gen  # said once per change, not every second
                log.warning("could not reload the namespace keys: %s", exc)
                continue
            if gone:
                forget(gone)
            if self.on_change is not None:  # the bucket's snapshot: retaken soon
                self.on_change()
