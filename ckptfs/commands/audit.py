"""``ckptfs audit tail|export|verify|seal``: the audit log of a state dir (catalog/audit.py)
from beside its daemon (the catalog read-only), and its seals on the remote tiers
(upload/seal.py). docs/governance.md "Audit log"."""

from __future__ import annotations

import datetime as dt
import json
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..catalog import Catalog
from ..catalog.audit import AuditEntry, verify_chain
from ..catalog.protocols import AuditCatalog, MetaCatalog
from ..catalog.recorded import remote_tier_of
from ..config import load_config
from ..errors import CkptfsError, TierError
from ..statedir import read_binding
from .live import open_catalog, resolve_state_dir

__all__ = ["cmd_export", "cmd_seal", "cmd_tail", "cmd_verify", "parse_since", "verify_log"]


def parse_since(text: str | None) -> tuple[int, int | None]:
    """``--since``: a seq (an integer) or a time (ISO 8601; UTC unless it says otherwise)
    as (since_seq, since_ns)."""
    if text is None:
        return 0, None
    if text.isdigit():
        return int(text), None
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise CkptfsError(f"--since {text!r}: expected a seq or an ISO 8601 time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return 0, int(when.timestamp() * 1e9)


def _line(e: AuditEntry) -> str:
    when = dt.datetime.fromtimestamp(e.time_ns / 1e9, dt.UTC)
    return (f"{e.seq:>8} {when.isoformat(timespec='microseconds')} {e.node} uid={e.uid} "
            f"pid={e.pid} {e.action} {e.path} {e.detail}")


def _print(entries: list[AuditEntry], as_json: bool) -> None:
    for e in entries:
        print(json.dumps(e.as_json(), sort_keys=True) if as_json else _line(e))


def _catalog(path: Path | None, state_dir: str | None) -> Catalog:
    return open_catalog(resolve_state_dir(path, state_dir))


def cmd_tail(path: Path | None, state_dir: str | None, n: int, as_json: bool) -> int:
    catalog = _catalog(path, state_dir)
    try:
        _print(catalog.audit_entries(last=n), as_json)
    finally:
        catalog.close()
    return 0


def cmd_export(path: Path | None, state_dir: str | None, since: str | None, as_json: bool) -> int:
    since_seq, since_ns = parse_since(since)
    catalog = _catalog(path, state_dir)
    try:
        batch, seq = 10_000, since_seq
        while True:  # in pages: a long log is not held in memory whole
            entries = catalog.audit_entries(since_seq=seq, since_ns=since_ns, limit=batch)
            _print(entries, as_json)
            if len(entries) < batch:
                return 0
            seq = entries[-1].seq + 1
    finally:
        catalog.close()


@dataclass
class Verdict:
    records: int = 0
    head: AuditEntry | None = None
    problems: list[str] = field(default_factory=list)
    seals: int = 0  # seals checked against the log
    notes: list[str] = field(default_factory=list)  # what was not checked, and why


class AuditLogCatalog(AuditCatalog, MetaCatalog, Protocol):
    """The audit log and the filesystem's id (what a seal names)."""


def _remotes(catalog: MetaCatalog) -> list[Any]:
    from ..tiers.s3 import S3Tier  # boto3 only for the commands that reach a remote

    return [S3Tier(remote_tier_of(t)) for t in catalog.recorded_tiers() if t.get("kind") == "s3"]


def verify_log(catalog: AuditLogCatalog, remotes: list[Any], public_key: Any | None) -> Verdict:
    """The chain of ``catalog``'s log and, on each of ``remotes``, its seals: each seal's
    signature (with ``public_key``; None: not authenticated) and that the log holds the
    record it names with the digest it names."""
    from ..upload.seal import list_seals, parse_seal  # cryptography only for audit commands

    v = Verdict()
    entries = catalog.audit_entries()
    v.records, v.head = len(entries), entries[-1] if entries else None
    v.problems += [p.message for p in verify_chain(entries, catalog.audit_genesis())]
    by_seq = {e.seq: e for e in entries}
    fs_id = catalog.get_meta("fs_id") or ""
    if not remotes:
        v.notes.append("no remote tier recorded: the log was not checked against seals "
                       "(a deletion of its newest records cannot be seen)")
    if public_key is None and remotes:
        v.notes.append("no public key given (--public-key): seal signatures not checked")
    top = v.head.seq if v.head is not None else 0
    beyond = 0  # the newest sealed seq past the end of the log
    for tier in remotes:
        try:
            found = list_seals(tier)
        except TierError as exc:
            v.notes.append(f"seals on {tier.name} not checked: {exc}")
            continue
        for name, body in found:
            try:
                seal = parse_seal(body)
            except CkptfsError as exc:
                v.problems.append(f"seal {name} on {tier.name}: {exc}")
                continue
            if seal.fs_id != fs_id:
                continue  # another file system's seal under the same prefix
            if public_key is not None and not seal.valid_under(public_key):
                v.problems.append(f"seal of record {seal.seq} on {tier.name}: bad signature "
                                  "(forged, or signed by another key)")
                continue
            v.seals += 1
            e = by_seq.get(seal.seq)
            if e is None and seal.seq > top:
                beyond = max(beyond, seal.seq)
            elif e is not None and e.digest != seal.digest:
                v.problems.append(f"record {seal.seq} differs from its seal (the log was "
                                  "rewritten from there on)")
    if beyond:
        v.problems.append(
            f"records {top + 1}..{beyond} are missing: the log ends at {top}, but record "
            f"{beyond} was sealed (deleted after the seal)")
    return v


def cmd_verify(path: Path | None, state_dir: str | None, public_key: str | None,
               config: str | None) -> int:
    sd = resolve_state_dir(path, state_dir)
    key_file = Path(public_key) if public_key else _configured_key(config, sd)
    key = None
    if key_file is not None:
        from ..upload.seal import load_public_key

        key = load_public_key(key_file)
    catalog = open_catalog(sd)
    try:
        remotes = _remotes(catalog)
        try:
            v = verify_log(catalog, remotes, key)
        finally:
            for t in remotes:
                t.close()
    finally:
        catalog.close()
    for note in v.notes:
        print(f"note: {note}")
    if v.problems:
        for p in v.problems:
            print(f"NOT INTACT: {p}")
        print(f"audit log of {sd}: NOT intact ({len(v.problems)} problem(s), "
              f"{v.records} records)")
        return 1
    head = "empty" if v.head is None else f"head {v.head.seq} {v.head.digest.hex()}"
    print(f"audit log of {sd}: intact, {v.records} records, {head}; "
          f"{v.seals} seal(s) match")
    return 0


def _configured_key(config: str | None, state_dir: Path) -> Path | None:
    """``audit.signing_key_file`` of ``config`` (None without a config)."""
    if config is None:
        return None
    return load_config(config, state_dir=state_dir).governance.audit.signing_key_file


def cmd_seal(path: Path | None, state_dir: str | None, config: str | None,
             key: str | None) -> int:
    """Sign the head of the log and store the seal on every remote tier."""
    from ..upload.seal import load_signing_key, make_seal, store_seal

    sd = resolve_state_dir(path, state_dir)
    key_file = Path(key) if key else _configured_key(config, sd)
    if key_file is None:
        raise CkptfsError("ckptfs audit seal needs the signing key: --config FILE (its "
                          "audit.signing_key_file) or --key FILE")
    signer = load_signing_key(key_file)
    catalog = open_catalog(sd)
    try:
        head = catalog.audit_head()
        fs_id = catalog.get_meta("fs_id") or ""
        remotes = _remotes(catalog)
    finally:
        catalog.close()
    if head is None:
        print("the audit log is empty: nothing to seal")
        return 0
    if not remotes:
        raise CkptfsError("no remote tier is recorded: a seal has nowhere to go")
    seal = make_seal(signer, fs_id, head, _node(sd), time.time_ns())
    failed = 0
    for tier in remotes:
        try:
            made = store_seal(tier, seal)
            print(f"sealed record {head.seq} ({head.digest.hex()[:16]}) on {tier.name}"
                  + ("" if made else " (already sealed)"))
        except CkptfsError as exc:
            print(f"ckptfs audit seal: {tier.name}: {exc}", file=sys.stderr)
            failed += 1
        finally:
            tier.close()
    return 1 if failed else 0


def _node(state_dir: Path) -> str:
    """The node name the daemon of ``state_dir`` records (its binding's), else the host's."""
    binding = read_binding(state_dir)
    return socket.gethostname() if binding is None else binding[1]
