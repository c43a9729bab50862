"""What a chunk PUT hashes and copies: the signature covers the checksum header (the
server checks the body against it), and a frame in a reused buffer goes out uncopied."""

from __future__ import annotations

import base64
import hashlib
import os
import tracemalloc
from typing import Any

import pytest

from tests.support.tier_conformance import framed, joined

from ckptfs.chunks.bufpool import FramePool
from ckptfs.codec import frame
from ckptfs.errors import TransientTierError
from ckptfs.tiers.s3 import S3Tier

MiB = 1024 * 1024


def _headers(request: Any) -> dict[str, str]:
    return {k.lower(): v.decode() if isinstance(v, bytes) else str(v)
            for k, v in request.headers.items()}


def _in_reused_buffer(parts: list[frame.Buffer]) -> memoryview:
    """The frame as the upload holds it: a view of a pool buffer (chunks/bufpool.py)."""
    body = joined(parts)
    buf = FramePool(keep=1).take(len(body))
    assert buf is not None
    view = memoryview(buf)[: len(body)]
    view[:] = body
    return view


def test_put_signs_the_checksum_header_and_hashes_the_body_once(s3_tier: S3Tier) -> None:
    """botocore signs the payload over plain HTTP by default: a second SHA-256 pass over
    every chunk besides the one its checksum header carries. The signature covers the
    checksum header instead, and the server still stores (and checks) that checksum."""
    sent: list[dict[str, str]] = []
    s3_tier.client.meta.events.register(
        "before-send.s3.PutObject", lambda request, **kw: sent.append(_headers(request))
    )
    key, parts = framed(os.urandom(2 * MiB))
    body = joined(parts)
    sha = base64.b64encode(hashlib.sha256(body).digest()).decode()
    s3_tier.put(key, [_in_reused_buffer(parts)], expected_sha256=sha)

    (headers,) = sent
    assert headers["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD"
    assert headers["x-amz-checksum-sha256"] == sha
    signed = headers["authorization"].split("SignedHeaders=", 1)[1].split(",", 1)[0]
    assert "x-amz-checksum-sha256" in signed.split(";")
    info = s3_tier.head(key)
    assert info is not None and info.checksum_sha256 == sha and info.size == len(body)
    got = s3_tier.get(key)
    assert got is not None and frame.decode(got, bytes.fromhex(key)) == body[frame.HEADER_SIZE:]


def test_put_of_a_frame_in_a_reused_buffer_makes_no_copy_of_it(s3_tier: S3Tier) -> None:
    """Joining a view into bytes for botocore was a 16 MiB copy onto fresh pages per
    chunk; the body is now read as views of the buffer itself."""
    key, parts = framed(os.urandom(8 * MiB))
    view = _in_reused_buffer(parts)
    sha = base64.b64encode(hashlib.sha256(view).digest()).decode()
    tracemalloc.start()
    try:
        s3_tier.put(key, [view], expected_sha256=sha)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * MiB, f"{peak} bytes allocated for an 8 MiB body"
    got = s3_tier.get(key)
    assert got is not None and bytes(got) == bytes(view)


def test_a_view_body_damaged_after_signing_is_refused(s3_tier: S3Tier) -> None:
    """Without a signed payload hash the checksum header alone binds the body: bytes
    changed after signing (as on the wire) are refused by the server, nothing is stored,
    and the put can be retried."""

    def damage(request: Any, **kw: Any) -> None:
        raw = request.body
        body = bytearray(raw.read() if hasattr(raw, "read") else raw)
        body[len(body) // 2] ^= 0x01
        request.body = bytes(body)

    key, parts = framed(os.urandom(2 * MiB))
    view = _in_reused_buffer(parts)
    sha = base64.b64encode(hashlib.sha256(view).digest()).decode()
    s3_tier.client.meta.events.register("before-send.s3.PutObject", damage)
    try:
        with pytest.raises(TransientTierError):
            s3_tier.put(key, [view], expected_sha256=sha)
    finally:
        s3_tier.client.meta.events.unregister("before-send.s3.PutObject", damage)
    assert s3_tier.get(key) is None
    s3_tier.put(key, [view], expected_sha256=sha)
    s3_tier.verify(key, bytes.fromhex(key))
