"""The audit chain's encoding and its verification (catalog/audit.py), without a catalog:
the canonical form is fixed (a golden digest), every field is covered, and
``verify_chain`` names what was edited, deleted or moved."""

from __future__ import annotations

import hashlib
from dataclasses import replace

from ckptfs.catalog.audit import (
    AuditEntry,
    canonical_json,
    genesis,
    record_bytes,
    record_digest,
    verify_chain,
)

G = genesis("fs-1")


def chain(n: int) -> list[AuditEntry]:
    out, prev = [], G
    for seq in range(1, n + 1):
        detail = canonical_json({"ino": seq, "size": seq * 10})
        d = record_digest(seq, 1000 + seq, "a", 1000, 42, "create", f"/f{seq}", detail, prev)
        out.append(AuditEntry(seq, 1000 + seq, "a", 1000, 42, "create", f"/f{seq}", detail, prev, d))
        prev = d
    return out


def test_the_encoding_is_length_prefixed_fields_in_a_fixed_order() -> None:
    raw = record_bytes(1, 5, "n", 0, 7, "open", "/p", "{}", b"\x00" * 32)
    parts, i = [], 0
    while i < len(raw):
        n = int.from_bytes(raw[i:i + 4], "big")
        parts.append(raw[i + 4:i + 4 + n])
        i += 4 + n
    assert parts == [b"ckptfs-audit-1", b"1", b"5", b"n", b"0", b"7", b"open", b"/p", b"{}",
                     b"\x00" * 32]
    # The digest is SHA-256 of exactly that (an independent verifier can recompute it).
    assert record_digest(1, 5, "n", 0, 7, "open", "/p", "{}", b"\x00" * 32) == \
        hashlib.sha256(raw).digest()


def test_fields_cannot_slide_into_each_other() -> None:
    # Without length prefixes "ab" + "c" and "a" + "bc" would hash alike.
    a = record_digest(1, 1, "ab", 0, 0, "c", "/", "{}", G)
    b = record_digest(1, 1, "a", 0, 0, "bc", "/", "{}", G)
    assert a != b


def test_every_field_changes_the_digest() -> None:
    base = (3, 10, "node", 5, 6, "unlink", "/x", '{"a":1}', G)
    seen = {record_digest(*base)}
    for i, other in enumerate((4, 11, "node2", 50, 60, "create", "/y", '{"a":2}', b"\x01" * 32)):
        changed = list(base)
        changed[i] = other
        seen.add(record_digest(*changed))  # type: ignore[arg-type]
    assert len(seen) == 10


def test_genesis_depends_on_the_file_system() -> None:
    assert genesis("fs-1") != genesis("fs-2") and len(G) == 32


def test_canonical_json_is_sorted_and_compact() -> None:
    assert canonical_json({"b": 1, "a": [1, "é"]}) == '{"a":[1,"\\u00e9"],"b":1}'


def test_an_intact_chain_has_no_problem() -> None:
    assert verify_chain(chain(5), G) == []
    assert verify_chain([], G) == []


def test_an_edited_record_is_named() -> None:
    rows = chain(5)
    rows[2] = replace(rows[2], uid=0)  # who did it, rewritten
    problems = verify_chain(rows, G)
    assert [(p.kind, p.seq) for p in problems] == [("edited", 3)]
    assert "record 3 was edited" in problems[0].message


def test_a_record_whose_digest_was_recomputed_breaks_the_next_link() -> None:
    rows = chain(5)
    e = replace(rows[1], path="/elsewhere")
    rows[1] = replace(e, digest=e.computed_digest())
    problems = verify_chain(rows, G)
    assert [(p.kind, p.seq) for p in problems] == [("edited", 3)]
    assert "does not follow record 2" in problems[0].message


def test_a_deleted_middle_record_is_a_gap() -> None:
    rows = chain(6)
    del rows[2:4]
    problems = verify_chain(rows, G)
    assert [(p.kind, p.seq, p.last) for p in problems] == [("missing", 3, 4)]
    assert "records 3..4 are missing" in problems[0].message


def test_swapped_records_are_reordered() -> None:
    rows = chain(5)
    a, b = rows[1], rows[3]  # records 2 and 4 trade places (everything but seq)
    rows[1] = replace(b, seq=2)
    rows[3] = replace(a, seq=4)
    problems = verify_chain(rows, G)
    assert [(p.kind, p.seq) for p in problems] == [("reordered", 2), ("reordered", 4)]
    assert "record at seq 2 is record 4 moved" in problems[0].message


def test_the_first_record_must_name_the_genesis() -> None:
    assert [p.kind for p in verify_chain(chain(3), genesis("other"))] == ["edited"]
