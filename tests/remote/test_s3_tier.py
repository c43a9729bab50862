"""S3Tier: the Tier conformance suite on a real SeaweedFS, plus what only a remote tier shows
(object metadata and wire checksums, clear permanent errors, outages, pagination), and the
error translation on its own (no server)."""

from __future__ import annotations

import base64
import errno
import hashlib
import http.server
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions as bce
import pytest
import urllib3.exceptions

from tests.support.s3fixtures import remove_prefix
from tests.support.s3server import (
    ACCESS_KEY,
    READER_ACCESS_KEY,
    READER_SECRET_KEY,
    SECRET_KEY,
    SeaweedServer,
    free_ports,
)
from tests.support.tier_conformance import TierConformance, framed, joined

from ckptfs.chunks.bufpool import FrameBuffer, FramePool
from ckptfs.codec import frame
from ckptfs.config import S3TierConfig, parse_remote_url
from ckptfs.errors import (
    AccessDenied,
    ChunkMissing,
    EndpointUnreachable,
    ObjectUnreadable,
    PermanentTierError,
    TierError,
    TransientTierError,
)
from ckptfs.tiers.s3 import META_DIGEST, META_PLAIN_LENGTH, S3Tier

TierFactory = Callable[..., S3Tier]


@pytest.fixture
def tier(s3_tier: S3Tier) -> S3Tier:  # noqa: F811
    return s3_tier


class TestS3Conformance(TierConformance):
    pass


# --------------------------------------------------------------------------- layout, metadata


def _headers(request: Any) -> dict[str, str]:
    out = {}
    for k, v in request.headers.items():
        out[k.lower()] = v.decode() if isinstance(v, bytes) else str(v)
    return out


def test_object_layout_metadata_and_checksum(s3_tier: S3Tier, seaweed: SeaweedServer) -> None:  # noqa: F811
    sent: list[dict[str, str]] = []
    s3_tier.client.meta.events.register(
        "before-send.s3.PutObject", lambda request, **kw: sent.append(_headers(request))
    )
    data = os.urandom(100_000)
    key, parts = framed(data)
    body = joined(parts)
    assert s3_tier.put(key, parts) == len(body)

    # The object sits at <prefix>/chunks/<digest>, and nowhere else.
    raw = seaweed.client().get_object(Bucket=seaweed.bucket, Key=f"{s3_tier.prefix}/chunks/{key}")
    assert raw["Body"].read() == body
    assert raw["Metadata"][META_DIGEST] == key
    assert raw["Metadata"][META_PLAIN_LENGTH] == str(len(data))

    # The checksum was requested: the PUT carried the SHA-256 of the frame.
    (headers,) = sent
    expected = base64.b64encode(hashlib.sha256(body).digest()).decode()
    assert headers["x-amz-checksum-sha256"] == expected
    assert headers["x-amz-meta-blake3"] == key

    info = s3_tier.head(key)
    assert info is not None
    assert info.size == len(body)
    assert info.blake3 == key
    assert info.plain_length == len(data)
    # SeaweedFS stores the checksum and returns it on HEAD (and GET, where botocore checks it).
    assert info.checksum_sha256 == expected
    assert s3_tier.head("0" * 64) is None


def test_server_rejects_a_body_that_does_not_match_its_checksum(s3_tier: S3Tier) -> None:  # noqa: F811
    key, parts = framed(os.urandom(10_000))
    body = joined(parts)
    wrong = base64.b64encode(hashlib.sha256(body + b"!").digest()).decode()
    with pytest.raises(bce.ClientError) as ei:
        s3_tier.client.put_object(
            Bucket=s3_tier.bucket, Key=s3_tier.object_key(key), Body=body, ChecksumSHA256=wrong
        )
    assert ei.value.response["Error"]["Code"] in ("BadDigest", "InvalidDigest")
    assert s3_tier.get(key) is None


def test_bytes_damaged_on_the_wire_are_refused_and_retryable(s3_tier: S3Tier) -> None:  # noqa: F811
    def damage(request: Any, **kw: Any) -> None:
        raw = request.body
        body = bytearray(raw.read() if hasattr(raw, "read") else raw)
        body[-1] ^= 0xFF  # after signing and checksumming: as if damaged in transit
        request.body = bytes(body)

    s3_tier.client.meta.events.register("before-send.s3.PutObject", damage)
    key, parts = framed(os.urandom(10_000))
    with pytest.raises(TransientTierError):
        s3_tier.put(key, parts)
    s3_tier.client.meta.events.unregister("before-send.s3.PutObject", damage)
    assert s3_tier.get(key) is None  # nothing damaged was stored
    s3_tier.put(key, parts)  # the retry goes through
    s3_tier.verify(key, bytes.fromhex(key))


def test_prefixes_keep_tiers_apart(s3_tier_factory: TierFactory, seaweed: SeaweedServer) -> None:  # noqa: F811
    a = s3_tier_factory(prefix=f"a-{uuid.uuid4().hex[:8]}/nested")
    b = s3_tier_factory(prefix=f"b-{uuid.uuid4().hex[:8]}")
    root = s3_tier_factory(prefix="")
    ka, pa = framed(b"in a")
    kb, pb = framed(b"in b")
    kr, pr = framed(b"at the root")
    a.put(ka, pa)
    b.put(kb, pb)
    root.put(kr, pr)
    try:
        # Something else under a's prefix but outside chunks/ is not a chunk.
        seaweed.client().put_object(Bucket=seaweed.bucket, Key=f"{a.prefix}/manifests/x", Body=b"m")
        assert list(a.list_keys()) == [ka]
        assert list(b.list_keys()) == [kb]
        assert kr in set(root.list_keys())
        assert root.object_key(kr) == f"chunks/{kr}"
        assert a.get(kb) is None and b.get(ka) is None
    finally:
        root.delete(kr)


def test_list_keys_paginates(s3_tier_factory: TierFactory) -> None:  # noqa: F811
    t = s3_tier_factory(list_page_size=4)
    calls: list[int] = []
    t.client.meta.events.register("before-call.s3.ListObjectsV2", lambda **kw: calls.append(1))
    frames = dict(framed(b"%d" % i) for i in range(10))
    for key, parts in frames.items():
        t.put(key, parts)
    assert sorted(t.list_keys()) == sorted(frames)
    assert len(calls) >= 3  # 10 keys, 4 a page


def test_delete_of_an_object_put_by_another_tier_object(s3_tier_factory: TierFactory) -> None:  # noqa: F811
    writer = s3_tier_factory()
    other = s3_tier_factory(prefix=writer.prefix)  # same place, fresh instance
    key, parts = framed(os.urandom(5000))
    n = writer.put(key, parts)
    assert other.usage().used == 0
    assert other.delete(key) == n  # size learnt by a HEAD
    assert other.delete(key) == 0
    assert writer.get(key) is None


# --------------------------------------------------------------------------- permanent errors


def test_missing_bucket_is_permanent_with_a_clear_message(s3_tier_factory: TierFactory) -> None:  # noqa: F811
    t = s3_tier_factory(bucket="ckptfs-no-such-bucket")
    msg = "bucket 'ckptfs-no-such-bucket' does not exist"
    with pytest.raises(PermanentTierError, match=msg):
        t.check()
    key, parts = framed(b"x")
    with pytest.raises(PermanentTierError, match=msg):
        t.put(key, parts)
    with pytest.raises(PermanentTierError, match=msg):
        t.get(key)
    with pytest.raises(PermanentTierError, match=msg):
        list(t.list_keys())


@pytest.mark.parametrize(
    ("access_key", "secret_key"),
    [(ACCESS_KEY, "not-the-secret"), ("ckptfs-unknown-key", SECRET_KEY)],
    ids=["wrong-secret", "unknown-key"],
)
def test_wrong_credentials_are_permanent_with_a_clear_message(
    s3_tier_factory: TierFactory,  # noqa: F811
    seaweed: SeaweedServer,  # noqa: F811
    access_key: str,
    secret_key: str,
) -> None:
    t = s3_tier_factory(session=seaweed.session(access_key, secret_key))
    msg = f"access denied to bucket '{seaweed.bucket}'"
    with pytest.raises(PermanentTierError, match=msg):
        t.check()
    key, parts = framed(b"x")
    with pytest.raises(PermanentTierError, match=msg):
        t.put(key, parts)
    with pytest.raises(PermanentTierError, match=msg):
        t.get(key)


def test_read_only_identity_cannot_put(s3_tier_factory: TierFactory, seaweed: SeaweedServer) -> None:  # noqa: F811
    writer = s3_tier_factory()
    reader = s3_tier_factory(
        prefix=writer.prefix, session=seaweed.session(READER_ACCESS_KEY, READER_SECRET_KEY)
    )
    key, parts = framed(b"readable")
    writer.put(key, parts)
    assert reader.get(key) == joined(parts)
    assert list(reader.list_keys()) == [key]
    other, other_parts = framed(b"not writable")
    with pytest.raises(PermanentTierError, match="access denied"):
        reader.put(other, other_parts)
    assert writer.get(other) is None


# --------------------------------------------------------------------------- credentials chain


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No AWS settings from this machine leak in; no instance-metadata lookups."""
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return monkeypatch


def _url_tier(server: SeaweedServer, query: str = "") -> S3Tier:
    url = f"s3://{server.bucket}/u-{uuid.uuid4().hex[:8]}?endpoint={server.endpoint}{query}"
    return S3Tier(parse_remote_url(url), connect_timeout=2, read_timeout=10)


def test_remote_url_tier_with_credentials_from_the_environment(
    seaweed: SeaweedServer, aws_env: pytest.MonkeyPatch  # noqa: F811
) -> None:
    aws_env.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    aws_env.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    t = _url_tier(seaweed)
    try:
        t.check()
        key, parts = framed(b"via the environment")
        t.put(key, parts)
        t.verify(key, bytes.fromhex(key))
    finally:
        remove_prefix(seaweed, t.bucket, t.prefix)
        t.close()


def test_remote_url_tier_with_a_profile(
    seaweed: SeaweedServer, aws_env: pytest.MonkeyPatch, tmp_path: Path  # noqa: F811
) -> None:
    creds = tmp_path / "credentials"
    creds.write_text(
        f"[ckpt]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n"
    )
    aws_env.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    t = _url_tier(seaweed, "&profile=ckpt")
    try:
        t.check()
    finally:
        t.close()
    with pytest.raises(PermanentTierError, match="profile 'nope'"):
        _url_tier(seaweed, "&profile=nope")


def test_no_credentials_at_all_is_permanent(
    seaweed: SeaweedServer, aws_env: pytest.MonkeyPatch  # noqa: F811
) -> None:
    t = _url_tier(seaweed)
    try:
        with pytest.raises(PermanentTierError, match="no usable AWS credentials"):
            t.check()
    finally:
        t.close()


# --------------------------------------------------------------------------- outages


def _dummy_session() -> Any:
    return boto3.session.Session(
        aws_access_key_id="offline", aws_secret_access_key="offline", region_name="us-east-1"
    )


def test_unreachable_endpoint_is_transient_and_quick() -> None:
    (port,) = free_ports(1)  # nothing listens there
    cfg = S3TierConfig(name="far", bucket="b-ckptfs", endpoint_url=f"http://127.0.0.1:{port}")
    t = S3Tier(cfg, session=_dummy_session(), connect_timeout=1, read_timeout=2)
    try:
        t0 = time.monotonic()
        with pytest.raises(TransientTierError, match=f"cannot reach endpoint http://127.0.0.1:{port}"):
            t.check()
        key, parts = framed(b"x")
        with pytest.raises(TransientTierError):
            t.put(key, parts)
        assert time.monotonic() - t0 < 5
    finally:
        t.close()


@pytest.mark.slow
def test_server_outage_is_transient_and_objects_survive_a_restart(
    s3_tier_factory: TierFactory, seaweed: SeaweedServer  # noqa: F811
) -> None:
    t = s3_tier_factory(connect_timeout=1, read_timeout=3)
    stored = dict(framed(os.urandom(50_000 + i)) for i in range(4))
    for key, parts in stored.items():
        t.put(key, parts)
    new_key, new_parts = framed(os.urandom(60_000))
    some_key = next(iter(stored))
    ops: list[tuple[str, Callable[[], object]]] = [
        ("put", lambda: t.put(new_key, new_parts)),
        ("get", lambda: t.get(some_key)),
        ("verify", lambda: t.verify(some_key, bytes.fromhex(some_key))),
        ("delete", lambda: t.delete(new_key)),
        ("list", lambda: list(t.list_keys())),
        ("check", t.check),
    ]
    seaweed.kill()  # a crash: the harshest outage
    try:
        for name, op in ops:
            t0 = time.monotonic()
            with pytest.raises(TransientTierError, match="cannot reach endpoint"):
                op()
            assert time.monotonic() - t0 < 5, f"{name} took too long to fail"
    finally:
        seaweed.start()
    t.check()
    t.put(new_key, new_parts)
    for key, parts in [*stored.items(), (new_key, new_parts)]:
        assert t.get(key) == joined(parts)
        t.verify(key, bytes.fromhex(key))
    assert sorted(t.list_keys()) == sorted([*stored, new_key])


# --------------------------------------------------------------------------- error translation


def _client_error(code: str, status: int, op: str = "PutObject") -> bce.ClientError:
    return bce.ClientError(
        {"Error": {"Code": code, "Message": f"{code} happened"},
         "ResponseMetadata": {"HTTPStatusCode": status}},
        op,
    )


@pytest.fixture(scope="module")
def offline_tier() -> Iterator[S3Tier]:
    """A tier whose client never connects anywhere (errors are injected)."""
    t = S3Tier(
        S3TierConfig(name="off", bucket="b-ckptfs", endpoint_url="http://127.0.0.1:9"),
        session=_dummy_session(),
        connect_timeout=1,
        read_timeout=1,
    )
    yield t
    t.close()


TRANSLATIONS: list[tuple[BaseException, type[TierError], str]] = [
    (_client_error("NoSuchBucket", 404), PermanentTierError, "bucket 'b-ckptfs' does not exist"),
    (_client_error("AccessDenied", 403), AccessDenied, "access denied to bucket 'b-ckptfs'"),
    (_client_error("InvalidAccessKeyId", 403), AccessDenied, "does not know this access key"),
    (_client_error("SignatureDoesNotMatch", 403), AccessDenied, "secret key does not match"),
    (_client_error("403", 403, "HeadBucket"), AccessDenied, "access denied"),
    (_client_error("InvalidArgument", 400), PermanentTierError, "refused: 400 InvalidArgument"),
    (_client_error("NotImplemented", 501), PermanentTierError, "NotImplemented"),
    (_client_error("SlowDown", 503), TransientTierError, "503 SlowDown"),
    (_client_error("Throttling", 400), TransientTierError, "Throttling"),
    (_client_error("RequestTimeout", 400), TransientTierError, "RequestTimeout"),
    (_client_error("InternalError", 500), TransientTierError, "InternalError"),
    (_client_error("BadGateway", 502), TransientTierError, "502"),
    (_client_error("TooManyRequests", 429), TransientTierError, "429"),
    (_client_error("BadDigest", 400), TransientTierError, "BadDigest"),
    (bce.EndpointConnectionError(endpoint_url="http://x"), EndpointUnreachable, "cannot reach"),
    (bce.ConnectTimeoutError(endpoint_url="http://x"), EndpointUnreachable, "cannot reach"),
    (bce.ConnectionClosedError(endpoint_url="http://x"), TransientTierError, "failed mid-request"),
    # After a good connection: the tier's problem unless the request was for one object
    # and the bucket still answers (test_remote_health.py).
    (bce.ReadTimeoutError(endpoint_url="http://x"), TransientTierError, "failed mid-request"),
    (bce.ResponseStreamingError(error="reset"), TransientTierError, "failed mid-request"),
    (urllib3.exceptions.ProtocolError("reset"), TransientTierError, "failed mid-request"),
    (ConnectionResetError(errno.ECONNRESET, "reset"), TransientTierError, "failed mid-request"),
    (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), EndpointUnreachable, "cannot reach"),
    (bce.FlexibleChecksumError(error_msg="mismatch"), TransientTierError, "checksum mismatch"),
    (bce.NoCredentialsError(), AccessDenied, "no usable AWS credentials"),
    (bce.SSLError(endpoint_url="https://x", error="certificate verify failed"),
     PermanentTierError, "TLS verification"),
]


@pytest.mark.parametrize(
    ("raised", "expected", "message"),
    TRANSLATIONS,
    ids=[f"{type(r).__name__}-{m[:20]}" for r, _, m in TRANSLATIONS],
)
def test_error_translation(
    offline_tier: S3Tier, raised: BaseException, expected: type[TierError], message: str
) -> None:
    with pytest.raises(expected, match=message) as ei, offline_tier._errors("put", "ab" * 32):
        raise raised
    assert ei.value.errno == errno.EIO
    assert str(ei.value).startswith(f"tier off: put {'ab' * 8}")
    assert ei.value.__cause__ is raised


def test_head_bucket_404_means_no_bucket(offline_tier: S3Tier) -> None:
    with pytest.raises(PermanentTierError, match="does not exist"), offline_tier._errors("check"):
        raise _client_error("404", 404, "HeadBucket")


def test_get_of_a_missing_object_is_a_miss_not_an_error(offline_tier: S3Tier) -> None:
    from botocore.stub import Stubber

    with Stubber(offline_tier.client) as stub:
        stub.add_client_error("get_object", "NoSuchKey", http_status_code=404)
        stub.add_client_error("get_object", "NoSuchBucket", http_status_code=404)
        stub.add_client_error("get_object", "InternalError", http_status_code=500)
        stub.add_client_error("get_object", "NoSuchKey", http_status_code=404)
        assert offline_tier.get("cd" * 32) is None
        with pytest.raises(PermanentTierError):
            offline_tier.get("cd" * 32)
        with pytest.raises(TransientTierError):
            offline_tier.get("cd" * 32)
        with pytest.raises(ChunkMissing):
            offline_tier.verify("cd" * 32, bytes(32))


def test_usage_is_nominal_and_device_is_per_bucket(offline_tier: S3Tier) -> None:
    u = offline_tier.usage()
    assert u.used == 0 and u.total == u.free > 1 << 40 and not u.capped
    same = S3Tier(
        S3TierConfig(name="x", bucket="b-ckptfs", prefix="other", endpoint_url="http://127.0.0.1:9")
    )
    other = S3Tier(S3TierConfig(name="y", bucket="c-ckptfs", endpoint_url="http://127.0.0.1:9"))
    assert same.usage().device == u.device != other.usage().device
    same.close()
    other.close()
    assert offline_tier.kind == "remote"


def test_a_body_cut_short_is_one_bad_object_only_while_the_bucket_answers() -> None:
    """A GET whose body ends before its Content-Length (the connection was good, the
    headers came): ObjectUnreadable when a HEAD of the bucket answers at once, else the
    tier's failure. The server side is stubbed: no real server truncates on demand."""
    import io

    from botocore.response import StreamingBody
    from botocore.stub import Stubber

    from ckptfs.errors import ObjectUnreadable

    t = S3Tier(S3TierConfig(name="cut", bucket="b-ckptfs", endpoint_url="http://127.0.0.1:9"),
               session=_dummy_session(), connect_timeout=1, read_timeout=1)
    try:
        def short_body() -> dict[str, Any]:
            return {"Body": StreamingBody(io.BytesIO(b"x" * 10), 100), "ContentLength": 100}

        with Stubber(t.client) as stub:
            stub.add_response("get_object", short_body())
            stub.add_response("get_object", short_body())
            # No probe answers (nothing listens on port 9): the tier failed.
            with pytest.raises(TransientTierError, match="failed mid-request") as ei:
                t.get("ef" * 32)
            assert not isinstance(ei.value, ObjectUnreadable)
            assert t.health.snapshot()["consecutive_failures"] == 1
            with Stubber(t._probe_client) as probe:
                probe.add_response("head_bucket", {})
                with pytest.raises(ObjectUnreadable, match="IncompleteReadError"):
                    t.get("ef" * 32)
            h = t.health.snapshot()
            assert h["state"] == "healthy" and h["consecutive_failures"] == 0
    finally:
        t.close()


def _connections_made(tier: S3Tier) -> int:
    """How many connections the tier's client opened to the endpoint (urllib3's count)."""
    manager = tier.client._endpoint.http_session._manager
    return sum(pool.num_connections for pool in manager.pools._container.values())


def test_get_into_reads_the_body_into_the_buffer_given_and_reuses_the_connection(
    s3_tier: S3Tier,
) -> None:
    """A chunk body lands in the pool's buffer (a view of it comes back, no other copy),
    the connection goes back to the pool after each GET, and small bodies and missing
    objects behave as with ``get``."""
    pool = FramePool(keep=2)
    big = os.urandom(2 * 1024 * 1024)
    key, body = framed(big)
    s3_tier.put(key, body)
    small_key, small_body = framed(b"tiny")
    s3_tier.put(small_key, small_body)
    before = _connections_made(s3_tier)
    for _ in range(12):
        got = s3_tier.get_into(key, pool.take)
        assert isinstance(got, memoryview) and isinstance(got.obj, FrameBuffer)
        assert frame.decode(got, bytes.fromhex(key)) == big
        pool.give(got.obj)
        del got
    assert pool.made == 1 and pool.reused == 11  # one buffer, read into again and again
    assert _connections_made(s3_tier) - before <= 1  # each GET left its connection reusable
    small = s3_tier.get_into(small_key, pool.take)
    assert isinstance(small, bytes) and frame.decode(small) == b"tiny"
    assert s3_tier.get_into("ab" * 32, pool.take) is None


class _CutShortHandler(http.server.BaseHTTPRequestHandler):
    """Every GET answers 2 MiB of Content-Length and sends half, then hangs up; HEAD
    (the tier's probe of the bucket) answers at once."""

    protocol_version = "HTTP/1.1"

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(2 * 1024 * 1024))
        self.end_headers()
        self.wfile.write(b"x" * (1024 * 1024))
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        return None


def test_get_into_a_body_cut_short_raises_and_returns_no_bytes() -> None:
    """The read straight into a receive buffer: a real HTTP body that ends before its
    Content-Length is an unreadable object (the bucket still answers), never a short or
    partly filled buffer handed back."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CutShortHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    t = S3Tier(S3TierConfig(name="cut", bucket="b-ckptfs", endpoint_url=endpoint,
                            addressing_style="path"),
               session=_dummy_session(), connect_timeout=2, read_timeout=5)
    pool = FramePool(keep=2)
    try:
        with pytest.raises(ObjectUnreadable, match="IncompleteReadError"):
            t.get_into("ef" * 32, pool.take)
        assert pool.made == 1  # it was reading into a pooled buffer when the body ended
    finally:
        t.close()
        server.shutdown()
        server.server_close()
        thread.join(10)
