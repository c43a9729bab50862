"""A drill's reads, blocking (worker threads): one chunk fetched from the remote tiers
alone (never a local tier, the read cache or the page cache), verified against its digest,
opened with the namespace's key, and written to its place in the scratch file."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..catalog import ChunkRef
from ..codec import frame
from ..codec.seal import KEYRING, KeyUnavailable
from ..errors import CorruptChunk, ObjectUnreadable, TierError
from ..tiers.base import Tier


@dataclass
class ChunkResult:
    """What restoring one chunk found: the bytes written (0 if no copy was good) and every
    problem (a bad copy is a problem even when another remote's copy was good)."""

    written: int = 0
    problems: list[str] = field(default_factory=list)


def restore_chunk(remotes: Sequence[Tier], ref: ChunkRef, fd: int, offset: int, what: str,
                  namespace: str | None) -> ChunkResult:
    """Fetch ``ref`` from the remotes that hold it (in order; the next one after a bad
    copy), verify it, write its plaintext at ``offset`` of ``fd``. ``namespace``: the
    encrypted namespace whose key must have sealed it (None: a plain frame). ``what``
    names the chunk in problems (file and index)."""
    got = ChunkResult()
    holders = [t for t in remotes if t.name in ref.tiers]
    if not holders:
        got.problems.append(f"{what}: no copy on a remote tier (a new node could not "
                            "restore it)")
        return got
    for tier in holders:
        try:
            raw = tier.get(ref.key)
        except ObjectUnreadable as exc:
            got.problems.append(f"{what}: object {ref.key} on {tier.name} unreadable: {exc}")
            continue
        except TierError as exc:
            got.problems.append(f"{what}: {tier.name}: {exc}")
            continue
        if raw is None:
            got.problems.append(f"{what}: object {ref.key} missing on {tier.name}")
            continue
        problem = _check(raw, ref, namespace)
        if isinstance(problem, str):
            got.problems.append(f"{what}: object {ref.key} on {tier.name}: {problem}")
            continue
        os.pwrite(fd, problem, offset)
        got.written = len(problem)
        return got
    return got


def _check(raw: frame.Buffer, ref: ChunkRef, namespace: str | None) -> frame.Buffer | str:
    """The verified plaintext, or what is wrong with the frame."""
    try:
        data = frame.decode_view(raw, ref.digest)
    except KeyUnavailable as exc:
        return f"key unavailable (missing or revoked): {exc}"
    except CorruptChunk as exc:
        return f"corrupt ({exc})"
    if len(data) != ref.length:
        return f"corrupt (length {len(data)}, the catalog says {ref.length})"
    key_id = frame.opened_key_id(data)
    if namespace is not None and key_id:
        key = KEYRING.get(key_id)
        if key is None or key.namespace != namespace:
            return f"sealed with key {key_id}, not one of namespace {namespace}'s"
    return data
