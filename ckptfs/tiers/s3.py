"""A remote tier in an S3 bucket (boto3).

Layout: ``<prefix>/chunks/<64 hex digest>``, one object per chunk frame. Each object carries
the blake3 digest of its plaintext (``x-amz-meta-blake3``, the key again, so an object can be
checked on its own), the plaintext length from the frame header (``x-amz-meta-plain-length``),
and an S3 checksum of the whole frame (``x-amz-checksum-sha256`` by default) that the server
verifies on receipt and returns on HEAD and GET. The request signature covers that header,
not the body itself (``UNSIGNED-PAYLOAD``: the signed checksum binds the body, and a second
SHA-256 pass per chunk is saved); GET responses are not checked by botocore, every frame
read is blake3-verified by the caller (chunks/store.py).

Errors: every call into botocore runs under one context manager, ``S3Tier._errors``, that
turns botocore/urllib3 exceptions into ``TransientTierError`` (throttling, 5xx, timeouts,
connection refused or reset, a checksum mismatch on the wire: worth retrying) or
``PermanentTierError`` (no such bucket, access denied, unknown key id, wrong secret, no
credentials: an operator must act; ``AccessDenied`` for refused credentials), and
``EndpointUnreachable`` for an endpoint that does not answer at all. Each error also tells
whether its request is in doubt (``TierError.in_doubt``, ``_in_doubt``): sent, perhaps, and
no answer read, so what it asked for may still happen at the server. A DELETE in doubt keeps
its deletion claim for ``request_grace_s`` (upload/deleter.py). A chunk GET that fails
after a good connection (a 500 for that key, a body cut short, a stalled read) is followed
by a HEAD of the bucket with short timeouts: if that answers, the object is bad, not the
tier (``ObjectUnreadable``, a CorruptChunk: the read path heals that copy). botocore's own
retries are off: the upload queue retries with its own backoff, and a read falls back to
another replica at once. Every call records in ``health`` whether the tier answered.

``usage`` cannot ask S3 for a size: ``total``/``free`` are a nominal 1 PiB, and ``used`` is
the sum of the sizes of the objects this tier object has put or listed (and not deleted).
``sync`` is a no-op: a successful PUT is durable.

The boto3 client is built once per tier; botocore clients are thread-safe for calls, so the
worker threads share it (``max_pool_connections`` bounds the open connections).

Fencing: while this node does not hold the prefix's writer lease (ckptfs/upload/lease.py),
``fence`` makes every write (chunk put and delete, ``put_meta``) fail at once; reads go on.
The lease object itself is written with ``put_meta_if`` (a conditional PUT: If-None-Match or
If-Match, which SeaweedFS 4.48 and AWS S3 honour atomically).
"""

from __future__ import annotations

import contextlib
import http.client
import mmap
import threading
import uuid
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import boto3
import botocore.config
import botocore.exceptions as bce
import botocore.response
import urllib3.exceptions

from ..codec import frame
from ..codec.frame import Buffer
from ..config import S3TierConfig
from ..errors import (
    AccessDenied,
    CorruptChunk,
    EndpointUnreachable,
    ObjectUnreadable,
    PermanentTierError,
    TierError,
    TransientTierError,
)
from .base import TierUsage, verify_by_reading
from .health import Health

# A nominal size for statfs: S3 has no capacity to ask for.
REMOTE_CAPACITY = 1 << 50  # 1 PiB

# SeaweedFS 4.48 verifies CRC32, CRC32C, SHA1 and SHA256 on PUT (a mismatch is BadDigest),
# stores the value and returns it on HEAD/GET. botocore computes CRC32C only with the optional
# awscrt package, so SHA-256 it is (about 1.7 GB/s with SHA-NI; CRC32 would be about 4 GB/s).
DEFAULT_CHECKSUM_ALGORITHM = "SHA256"

META_DIGEST = "blake3"
META_PLAIN_LENGTH = "plain-length"

_NOT_FOUND_CODES = {"NoSuchKey", "NotFound", "404"}
_NO_BUCKET_CODES = {"NoSuchBucket"}
_ACCESS_CODES = {
    "AccessDenied",
    "AllAccessDisabled",
    "AccountProblem",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidSecurity",
    "InvalidToken",
    "ExpiredToken",
    "TokenRefreshRequired",
    "RequestTimeTooSkewed",
    "403",
}
_ACCESS_HINTS = {
    "InvalidAccessKeyId": "the server does not know this access key id",
    "SignatureDoesNotMatch": "the secret key does not match the access key id",
    "ExpiredToken": "the session token has expired",
    "RequestTimeTooSkewed": "this machine's clock is too far from the server's",
}
_TRANSIENT_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "TooManyRequests",
    "RequestLimitExceeded",
    "RequestTimeout",
    "RequestTimeoutException",
    "InternalError",
    "ServiceUnavailable",
    "OperationAborted",
    "IncompleteBody",
    # The body arrived damaged (it no longer matches the checksum we sent): send it again.
    "BadDigest",
    "InvalidDigest",
    "XAmzContentSHA256Mismatch",
}
_PERMANENT_5XX_CODES = {"NotImplemented"}

# The health probe's timeouts (connect and read): a HEAD of the bucket answers at once.
PROBE_TIMEOUT_S = 3.0

# How long after a request in doubt failed it may still take effect at the server, as a
# multiple of connect_timeout + read_timeout (``S3Tier.request_grace_s``). Once connected,
# the request was sent within the connect window, and we gave up after read_timeout of
# silence; the server (or a proxy in front of it) may hold the request as long again before
# it runs it, and S3 itself promises no bound at all. Twice the window is that margin: it
# costs only that uploads of the object wait (deleter.py), never data.
REQUEST_GRACE_FACTOR = 2

# Failures to talk to the endpoint at all: nothing was sent or answered.
_UNREACHABLE_ERRORS: tuple[type[BaseException], ...] = (
    bce.EndpointConnectionError,
    bce.ConnectTimeoutError,
    bce.ProxyConnectionError,
    ConnectionRefusedError,
    urllib3.exceptions.NewConnectionError,
    urllib3.exceptions.ConnectTimeoutError,
)
# Failures of the connection mid-request (after it was made): the request may have been
# sent, and no answer was read (``_in_doubt``).
_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    bce.ConnectionClosedError,
    bce.ReadTimeoutError,
    bce.HTTPClientError,  # includes ResponseStreamingError (a reset while reading a body)
    bce.IncompleteReadError,
    urllib3.exceptions.HTTPError,  # the rare one botocore does not wrap
    ConnectionError,
    TimeoutError,
)
_CREDENTIAL_ERRORS: tuple[type[BaseException], ...] = (
    bce.NoCredentialsError,
    bce.PartialCredentialsError,
    bce.CredentialRetrievalError,
    bce.ProfileNotFound,
    bce.TokenRetrievalError,
    bce.NoAuthTokenError,
)


def _in_doubt(exc: BaseException) -> bool:
    """The request may have been sent and no answer was read: what it asked for may still
    happen. False for an answer of the server (any HTTP status: the request is finished,
    a response checksum that did not match was an answer too), and for failures before
    anything was sent (no connection made, no credentials, a request botocore refused to
    build, a TLS certificate refused in the handshake). True for the rest: a read timeout,
    a connection reset or closed mid-request, an unknown error (nothing known was not sent)."""
    if isinstance(exc, bce.ClientError):
        return False
    if isinstance(exc, (*_CREDENTIAL_ERRORS, *_UNREACHABLE_ERRORS)):
        return False
    if isinstance(exc, bce.SSLError):
        text = str(exc).lower()
        return not ("certificate" in text or "hostname" in text)  # verification: handshake
    if isinstance(exc, _CONNECTION_ERRORS):
        return True
    # A response that failed its checksum was an answer; a request botocore refused to
    # build was never sent. Anything else: not known not to have been sent.
    return not isinstance(exc, bce.FlexibleChecksumError | bce.ChecksumError
                          | bce.ParamValidationError | bce.ValidationError)


@dataclass(frozen=True)
class ObjectInfo:
    """What a HEAD of a chunk object tells (``S3Tier.head``)."""

    size: int
    blake3: str | None  # x-amz-meta-blake3
    plain_length: int | None  # x-amz-meta-plain-length
    checksum_sha256: str | None  # base64, when the server stored one
    metadata: dict[str, str]


class NoSuchBucket(PermanentTierError):
    """The bucket does not exist at the endpoint."""


class ReadOnlyCredentials(PermanentTierError):
    """The credentials may read the prefix but not write (or delete) objects under it."""


class PreconditionFailed(PermanentTierError):
    """A conditional write lost: the object changed (or appeared) since it was read."""


class ConditionalWriteUnsupported(PermanentTierError):
    """The server refuses If-Match / If-None-Match on PutObject."""


def _after_connection(exc: BaseException) -> bool:
    """The request reached the server and broke off, or the server failed this request:
    a 500, a body shorter than its length, a stalled read. (Throttling, 503 and gateway
    errors are the server's state, not an object's.)"""
    if isinstance(exc, bce.ClientError):
        return _status(exc) == 500 and _code(exc) not in _TRANSIENT_CODES - {"InternalError"}
    if isinstance(exc, _UNREACHABLE_ERRORS):
        return False
    return isinstance(exc, (*_CONNECTION_ERRORS, bce.IncompleteReadError))


def _filler(body: Any) -> Callable[[memoryview], None] | None:
    """A function that reads the whole of a GET's body into a buffer of its length, or
    None when the body is not a plain HTTP body this can read (then ``read()`` it).

    urllib3's own ``readinto`` reads into a new bytes object and copies; this reads from
    the http.client response beneath it, under urllib3's error handling (timeouts and
    broken connections raise as from ``read``, and a broken connection is not reused),
    and gives the connection back to the pool as urllib3 does after a full read."""
    if type(body) is not botocore.response.StreamingBody:
        return None  # e.g. a checksum-validating body: it must see the bytes
    raw: Any = getattr(body, "_raw_stream", None)
    fp = getattr(raw, "_fp", None)
    catcher = getattr(raw, "_error_catcher", None)
    if not isinstance(fp, http.client.HTTPResponse) or catcher is None:
        return None
    if getattr(raw, "_decoder", None) is not None or (
        str(getattr(raw, "headers", {}).get("content-encoding", "")).lower()
        not in ("", "identity")
    ):
        return None  # an encoded body: urllib3 must decode it

    def fill(view: memoryview) -> None:
        got = 0
        with catcher():
            while got < len(view):
                k = fp.readinto(view[got:])
                if not k:
                    raise bce.IncompleteReadError(actual_bytes=got, expected_bytes=len(view))
                got += k
        if fp.isclosed():
            raw.release_conn()

    return fill


class _ViewBody:
    """A PUT body read as views of one buffer. botocore takes bytes, a bytearray or a
    file-like object (no memoryview), and joining a frame read into a reused buffer into
    bytes is a 16 MiB copy onto fresh pages per chunk. urllib3 sends a file-like body in
    reads of 128 KiB (botocore's block size); each read here is a view, so no byte is
    copied before the socket's."""

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._pos = 0

    def __len__(self) -> int:  # botocore's Content-Length
        return len(self._view)

    def read(self, amt: int | None = -1) -> memoryview:
        start, end = self._pos, len(self._view)
        if amt is not None and amt >= 0:
            end = min(end, start + amt)
        self._pos = end
        return self._view[start:end]

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self._pos, len(self._view))[whence]
        self._pos = max(0, min(len(self._view), base + offset))
        return self._pos

    def tell(self) -> int:
        return self._pos


def _body_of(parts: Sequence[Buffer]) -> tuple[Buffer, bytes | bytearray | _ViewBody]:
    """The object's bytes, and the body to hand botocore: one part as it is (a view of a
    reused buffer read as views, not copied), several joined."""
    if len(parts) == 1:
        part = parts[0]
        if isinstance(part, bytes | bytearray):
            return part, part
        view = memoryview(part)
        if view.contiguous:
            view = view.cast("B")
            return view, _ViewBody(view)
    data = b"".join(parts)
    return data, data


def _code(exc: bce.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: bce.ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def _is_not_found(exc: bce.ClientError) -> bool:
    """A missing object (not a missing bucket)."""
    return _code(exc) in _NOT_FOUND_CODES


def _client_config(cfg: S3TierConfig, max_pool_connections: int, connect_timeout: float,
                   read_timeout: float) -> botocore.config.Config:
    """How every S3 client of a tier talks to the server (retries, checksums, signing)."""
    return botocore.config.Config(
        region_name=cfg.region,
        signature_version="s3v4",
        max_pool_connections=max_pool_connections,
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        retries={"total_max_attempts": 1, "mode": "standard"},  # our own retry layer
        # Every frame read back is blake3-verified: a second (SHA-256) check of each
        # response costs CPU a restore needs. Uploads keep their SHA-256.
        response_checksum_validation="when_required",
        # Every PUT carries a checksum header of its body (ours, or botocore's for
        # the metadata objects), which the signature covers and the server checks
        # against what arrives: that binds the body as a signed payload hash would.
        # botocore signs the payload over plain HTTP anyway, a second SHA-256 pass
        # over every chunk (over HTTPS with a checksum header it does not).
        s3={"addressing_style": cfg.addressing_style, "payload_signing_enabled": False},
        tcp_keepalive=True,
        user_agent_extra="ckptfs",
    )


class S3Tier:
    kind = "remote"
    verified_put = False  # a PUT carries a SHA-256 the server checks; verify is a HEAD

    def __init__(
        self,
        cfg: S3TierConfig,
        *,
        session: boto3.session.Session | None = None,
        max_pool_connections: int = 32,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        list_page_size: int = 1000,
        checksum_algorithm: str = DEFAULT_CHECKSUM_ALGORITHM,
    ) -> None:
        """``session`` overrides the standard AWS credential chain (tests, embedding);
        otherwise credentials come from the environment, the shared files and ``cfg.profile``."""
        self.name = cfg.name
        self.location = cfg.location
        self.weight = cfg.weight
        self.bucket = cfg.bucket
        self.prefix = cfg.prefix
        self.checksum_algorithm = checksum_algorithm
        self.list_page_size = list_page_size
        self._chunks_prefix = f"{cfg.prefix}/chunks/" if cfg.prefix else "chunks/"
        self._lock = threading.Lock()
        self._sizes: dict[str, int] = {}  # objects seen (put, listed, headed), for usage()
        self._fence: tuple[str, bool] | None = None  # (reason, permanent) while writes are refused
        self.health = Health()  # what the last calls said about the tier (status, metrics)
        self._probe_client: Any = None  # made at the first health probe
        self._connect_timeout, self._read_timeout = connect_timeout, read_timeout
        client_config = _client_config(cfg, max_pool_connections, connect_timeout, read_timeout)
        try:
            if session is None:
                session = boto3.session.Session(profile_name=cfg.profile, region_name=cfg.region)
            self._session = session
            self._endpoint_url, self._region, self._verify = (
                cfg.endpoint_url, cfg.region, cfg.verify_tls
            )
            self._client_config = client_config
            self._client: Any = session.client(
                "s3",
                endpoint_url=cfg.endpoint_url,
                region_name=cfg.region,
                verify=cfg.verify_tls,
                config=client_config,
            )
        except bce.ProfileNotFound as exc:
            raise PermanentTierError(
                f"tier {self.name}: AWS profile {cfg.profile!r} not found ({exc})"
            ) from exc
        except (bce.BotoCoreError, ValueError) as exc:
            raise PermanentTierError(f"tier {self.name}: cannot create an S3 client: {exc}") from exc
        self.endpoint = str(cfg.endpoint_url or self._client.meta.endpoint_url)
        # A stable id for statfs: tiers in the same bucket share its space.
        self._device = -1 - zlib.crc32(f"{self.endpoint}|{self.bucket}".encode())

    @property
    def client(self) -> Any:
        """The boto3 S3 client (thread-safe), for tools and tests."""
        return self._client

    @property
    def request_grace_s(self) -> float:
        """How long after a request in doubt failed (``TierError.in_doubt``) it may still
        take effect at the server: REQUEST_GRACE_FACTOR x (connect_timeout + read_timeout).
        botocore's retries are off (``total_max_attempts`` 1), so no retry of ours is sent
        behind our back later."""
        return float(REQUEST_GRACE_FACTOR * (self._connect_timeout + self._read_timeout))

    # -- errors ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _errors(
        self, op: str, key: str | None = None, *, per_object: bool = False,
        changes: bool = True,
    ) -> Iterator[None]:
        """Translate what botocore and urllib3 raise into Transient/PermanentTierError, and
        record in ``health`` whether the tier answered.

        ``op == "check"`` marks a bucket-level call, where a bare 404 means "no bucket".
        ``per_object`` (a chunk GET): a failure after the connection was made (a 500 for
        this key, a body cut short, a read that stalls) is this object's problem if the
        bucket still answers a HEAD at once: ObjectUnreadable, not a failure of the tier.
        ``changes`` False: these requests change nothing (the HEAD before a DELETE), so an
        error of theirs is not in doubt (``TierError.in_doubt``) whatever it was.
        """
        what = f"tier {self.name}: {op}" + (f" {key[:16]}" if key else "")
        try:
            yield
        except (bce.BotoCoreError, bce.ClientError, urllib3.exceptions.HTTPError,
                ConnectionError, TimeoutError) as exc:
            err = self._translate(what, op, exc)
            err.in_doubt = changes and _in_doubt(exc)
            if isinstance(err, PreconditionFailed | ConditionalWriteUnsupported):
                self.health.ok()  # the server answered: it refused this write
                raise err from exc
            if per_object and _after_connection(exc) and self._endpoint_answers():
                self.health.ok()
                raise ObjectUnreadable(
                    f"{what}: this object cannot be read although the endpoint answers "
                    f"({type(exc).__name__}: {exc})"
                ) from exc
            self.health.failed(err)
            raise err from exc
        self.health.ok()

    def _translate(self, what: str, op: str, exc: BaseException) -> TierError:
        if isinstance(exc, bce.ClientError):
            return self._from_client_error(what, op, exc)
        if isinstance(exc, _CREDENTIAL_ERRORS):
            return AccessDenied(
                f"{what}: no usable AWS credentials for bucket {self.bucket!r}: {exc}"
            )
        if isinstance(exc, bce.SSLError):
            text = str(exc)
            if "certificate" in text.lower() or "hostname" in text.lower():
                return PermanentTierError(
                    f"{what}: TLS verification of {self.endpoint} failed: {text}"
                )
            return TransientTierError(f"{what}: TLS error talking to {self.endpoint}: {text}")
        if isinstance(exc, _UNREACHABLE_ERRORS):
            return EndpointUnreachable(f"{what}: cannot reach endpoint {self.endpoint}: {exc}")
        if isinstance(exc, _CONNECTION_ERRORS):
            return TransientTierError(
                f"{what}: connection to {self.endpoint} failed mid-request: {exc}"
            )
        if isinstance(exc, bce.FlexibleChecksumError | bce.ChecksumError):
            return TransientTierError(f"{what}: checksum mismatch on the wire: {exc}")
        if isinstance(exc, bce.ParamValidationError | bce.ValidationError):
            return PermanentTierError(f"{what}: invalid request: {exc}")
        return TransientTierError(f"{what}: {type(exc).__name__}: {exc}")

    def _endpoint_answers(self) -> bool:
        """A HEAD of the bucket with short timeouts (the health probe after a request
        broke off): True if the server answers it."""
        try:
            self._probe().head_bucket(Bucket=self.bucket)
        except (bce.BotoCoreError, bce.ClientError, urllib3.exceptions.HTTPError,
                ConnectionError, TimeoutError):
            return False
        return True

    def unreachable(self) -> TierError | None:
        """At mount: a HEAD of the bucket with the probe's short timeouts, so that a hung
        endpoint costs seconds, not ``read_timeout``. None if the server answered,
        whatever it said (``check`` tells what); else why not, recorded in ``health``."""
        try:
            self._probe().head_bucket(Bucket=self.bucket)
        except bce.ClientError:
            return None  # an answer: no bucket, access denied, ... are check()'s to report
        except (bce.BotoCoreError, urllib3.exceptions.HTTPError, ConnectionError,
                TimeoutError) as exc:
            err = self._translate(f"tier {self.name}: check", "check", exc)
            if isinstance(err, PermanentTierError):
                return None  # no credentials, a TLS certificate refused: check() says so
            self.health.failed(err)
            return err
        return None

    def _probe(self) -> Any:
        """The client with the health probe's short timeouts (made on first use)."""
        probe = self._probe_client
        if probe is None:  # made outside the lock: building a client reads its model files
            probe = self._session.client(
                "s3", endpoint_url=self._endpoint_url, region_name=self._region,
                verify=self._verify, config=self._client_config.merge(botocore.config.Config(
                    connect_timeout=min(self._connect_timeout, PROBE_TIMEOUT_S),
                    read_timeout=min(self._read_timeout, PROBE_TIMEOUT_S),
                )),
            )
            with self._lock:
                if self._probe_client is None:
                    self._probe_client = probe
                else:  # another thread made one first
                    probe.close()
                    probe = self._probe_client
        return probe

    def _from_client_error(self, what: str, op: str, exc: bce.ClientError) -> TierError:
        code, status = _code(exc), _status(exc)
        detail = str(exc.response.get("Error", {}).get("Message", "") or "")
        if code in _NO_BUCKET_CODES or (op == "check" and status == 404):
            return NoSuchBucket(
                f"{what}: bucket {self.bucket!r} does not exist at {self.endpoint}"
            )
        if code in ("PreconditionFailed", "ConditionalRequestConflict") or status == 412:
            return PreconditionFailed(f"{what}: precondition failed ({code or status}): {detail}")
        if code in _ACCESS_CODES or status == 403:
            hint = _ACCESS_HINTS.get(code) or (
                # A HEAD answer has no body to say why: the code is the bare status.
                detail if detail and not code.isdigit() else
                "wrong access key or secret, or no permission on the bucket"
            )
            return AccessDenied(
                f"{what}: access denied to bucket {self.bucket!r} at {self.endpoint} "
                f"({code or status}: {hint})"
            )
        if code in _TRANSIENT_CODES or status in (408, 429) or (
            status >= 500 and code not in _PERMANENT_5XX_CODES
        ):
            return TransientTierError(
                f"{what}: server error {status} {code}: {detail}".rstrip(": ")
            )
        return PermanentTierError(f"{what}: request refused: {status} {code}: {detail}".rstrip(": "))

    # -- the Tier protocol -------------------------------------------------------------------

    def object_key(self, key: str) -> str:
        return self._chunks_prefix + key

    def put(self, key: str, parts: Sequence[Buffer], expected_sha256: str | None = None) -> int:
        """``expected_sha256`` (base64): the checksum of the bytes the caller verified; the
        server refuses the object (BadDigest, retried) if what arrives differs."""
        self._check_fence("put", key)
        data, body = _body_of(parts)
        metadata = {META_DIGEST: key}
        with contextlib.suppress(CorruptChunk):  # a tier stores what it is given
            metadata[META_PLAIN_LENGTH] = str(frame.parse_header(data).plain_len)
        checksum: dict[str, str] = (
            {"ChecksumSHA256": expected_sha256} if expected_sha256
            else {"ChecksumAlgorithm": self.checksum_algorithm}
        )
        with self._errors("put", key):
            self._client.put_object(
                Bucket=self.bucket,
                Key=self.object_key(key),
                Body=body,
                ContentType="application/octet-stream",
                Metadata=metadata,
                **checksum,
            )
        with self._lock:
            self._sizes[key] = len(data)
        return len(data)

    def get(self, key: str) -> bytes | None:
        """ObjectUnreadable if this chunk's object fails while the bucket answers."""
        return self._get_object(self.object_key(key), key, per_object=True)

    def get_into(
        self, key: str, take: Callable[[int], bytearray | mmap.mmap | None]
    ) -> Buffer | None:
        """Like ``get``, but the body is read straight into ``take(length)`` (a reused
        buffer: no fresh pages to fault in) and comes back as a view of it; when ``take``
        gives None, or the response is not a plain HTTP body, it is read as ``get`` does."""
        with self._errors("get", key, per_object=True):
            try:
                resp = self._client.get_object(Bucket=self.bucket, Key=self.object_key(key))
            except bce.ClientError as exc:
                if _is_not_found(exc):
                    return None
                raise
            body = resp["Body"]
            try:
                n = int(resp.get("ContentLength", -1))
                fill = _filler(body) if n >= 0 else None
                buf = take(n) if fill is not None else None
                if fill is None or buf is None:
                    data: Buffer = body.read()
                else:
                    data = memoryview(buf)[:n]
                    fill(data)
            finally:
                body.close()
        return data

    def _get_object(self, object_key: str, what: str, per_object: bool = False) -> bytes | None:
        """The body of one object, or None if it does not exist."""
        found = self._get_object_tagged(object_key, what, per_object)
        return None if found is None else found[0]

    def _get_object_tagged(
        self, object_key: str, what: str, per_object: bool = False
    ) -> tuple[bytes, str] | None:
        """The body and ETag of one object, or None if it does not exist."""
        with self._errors("get", what, per_object=per_object):
            try:
                resp = self._client.get_object(Bucket=self.bucket, Key=object_key)
            except bce.ClientError as exc:
                if _is_not_found(exc):
                    return None
                raise
            body = resp["Body"]
            try:
                data: bytes = body.read()  # botocore checks length and returned checksum
            finally:
                body.close()
        return data, str(resp.get("ETag") or "")

    def has(self, key: str) -> bool:
        return self.head(key) is not None

    def head(self, key: str) -> ObjectInfo | None:
        """The object's size, metadata and stored checksum, without its body (None: missing)."""
        with self._errors("head", key):
            try:
                resp = self._client.head_object(
                    Bucket=self.bucket, Key=self.object_key(key), ChecksumMode="ENABLED"
                )
            except bce.ClientError as exc:
                if _is_not_found(exc):
                    return None
                raise
        meta = {str(k).lower(): str(v) for k, v in (resp.get("Metadata") or {}).items()}
        plain = meta.get(META_PLAIN_LENGTH)
        size = int(resp["ContentLength"])
        with self._lock:
            self._sizes[key] = size
        return ObjectInfo(
            size=size,
            blake3=meta.get(META_DIGEST),
            plain_length=int(plain) if plain and plain.isdigit() else None,
            checksum_sha256=resp.get("ChecksumSHA256"),
            metadata=meta,
        )

    def verify(self, key: str, digest: bytes) -> None:
        """Read the object back and check the frame (a full remote read)."""
        verify_by_reading(self, key, digest)

    def delete(self, key: str) -> int:
        """Idempotent. Returns the bytes freed: the size this tier saw, else a HEAD's answer."""
        self._check_fence("delete", key)
        with self._lock:
            size = self._sizes.pop(key, None)
        if size is None:
            # Not in doubt if it fails: no DELETE was sent.
            with self._errors("delete", key, changes=False):
                try:
                    resp = self._client.head_object(Bucket=self.bucket, Key=self.object_key(key))
                except bce.ClientError as exc:
                    if _is_not_found(exc):
                        return 0
                    raise
                size = int(resp["ContentLength"])
        with self._errors("delete", key):
            self._client.delete_object(Bucket=self.bucket, Key=self.object_key(key))
        return size

    def sync(self, keys: Sequence[str]) -> None:
        """Nothing to do: a PUT that succeeded is durable."""
        return None

    def list_keys(self) -> Iterator[str]:
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {
                "Bucket": self.bucket,
                "Prefix": self._chunks_prefix,
                "MaxKeys": self.list_page_size,
            }
            if token:
                kwargs["ContinuationToken"] = token
            with self._errors("list"):
                resp = self._client.list_objects_v2(**kwargs)
            page: list[tuple[str, int]] = []
            for obj in resp.get("Contents") or ():
                name = str(obj["Key"])[len(self._chunks_prefix) :]
                if name and "/" not in name:
                    page.append((name, int(obj.get("Size", 0))))
            with self._lock:
                self._sizes.update(page)
            for name, _ in page:
                yield name
            token = resp.get("NextContinuationToken")
            if not resp.get("IsTruncated") or not token:
                return

    def usage(self) -> TierUsage:
        with self._lock:
            used = sum(self._sizes.values())
        return TierUsage(
            total=REMOTE_CAPACITY,
            free=max(0, REMOTE_CAPACITY - used),
            used=used,
            device=self._device,
            capped=False,
        )

    def check(self) -> None:
        """Raise PermanentTierError (no bucket, access denied, no credentials) or
        TransientTierError (endpoint unreachable, 5xx) unless the bucket answers."""
        with self._errors("check"):
            self._client.head_bucket(Bucket=self.bucket)

    def probe_write(self) -> None:
        """Put and delete a small object under the prefix (``meta/write-probe-*``): raises
        ReadOnlyCredentials if the credentials cannot do both, another TierError if the
        remote does not answer. Not fenced: it touches no object another writer owns."""
        name = f"write-probe-{uuid.uuid4().hex}"
        for op in ("put", "delete"):
            try:
                with self._errors(op, name):
                    if op == "put":
                        self._client.put_object(
                            Bucket=self.bucket, Key=self._meta_key(name), Body=b"ckptfs",
                            ContentType="application/octet-stream",
                            ChecksumAlgorithm=self.checksum_algorithm,
                        )
                    else:
                        self._client.delete_object(Bucket=self.bucket, Key=self._meta_key(name))
            except PermanentTierError as exc:
                if isinstance(exc, NoSuchBucket):
                    raise
                where = f"s3://{self.bucket}/{self.prefix}"
                raise ReadOnlyCredentials(
                    f"tier {self.name}: the credentials can read {where} but not "
                    f"{'write' if op == 'put' else 'delete'} objects there (a probe object "
                    f"{op} was refused: {exc}); ckptfs needs read, write and delete on the prefix"
                ) from exc

    # -- metadata objects (the catalog snapshot a fresh node restores) -------------------------

    def _meta_key(self, name: str) -> str:
        return (f"{self.prefix}/meta/" if self.prefix else "meta/") + name

    def put_meta(self, name: str, data: bytes) -> None:
        self._check_fence("put", name)
        with self._errors("put", name):
            self._client.put_object(
                Bucket=self.bucket, Key=self._meta_key(name), Body=data,
                ContentType="application/octet-stream", ChecksumAlgorithm=self.checksum_algorithm,
            )

    def get_meta(self, name: str) -> bytes | None:
        return self._get_object(self._meta_key(name), name)

    def list_meta(self, under: str) -> list[str]:
        """The names of the metadata objects under ``under/`` (e.g. the audit seals),
        relative to it, sorted."""
        base = self._meta_key(under.rstrip("/") + "/")
        names: list[str] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": base,
                                      "MaxKeys": self.list_page_size}
            if token:
                kwargs["ContinuationToken"] = token
            with self._errors("list"):
                resp = self._client.list_objects_v2(**kwargs)
            names += [str(o["Key"])[len(base):] for o in resp.get("Contents") or ()]
            token = resp.get("NextContinuationToken")
            if not resp.get("IsTruncated") or not token:
                return sorted(n for n in names if n)

    # -- the writer lease (ckptfs/upload/lease.py) -------------------------------------------

    def get_meta_tagged(self, name: str) -> tuple[bytes, str] | None:
        """A metadata object's body and ETag (for ``put_meta_if``), or None if missing."""
        return self._get_object_tagged(self._meta_key(name), name)

    def put_meta_if(
        self, name: str, data: bytes, *, etag: str | None, conditional: bool = True
    ) -> str:
        """Write a metadata object only if it is as last read: unchanged since ``etag`` was
        read (If-Match), or still missing when ``etag`` is None (If-None-Match: *). Returns
        the new ETag. Raises PreconditionFailed when another writer came first, and
        ConditionalWriteUnsupported when the server refuses the headers (then
        ``conditional=False`` writes unconditionally). Not fenced: this writes the lease."""
        cond: dict[str, str] = {}
        if conditional:
            cond = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
        try:
            with self._errors("put", name):
                resp = self._client.put_object(
                    Bucket=self.bucket, Key=self._meta_key(name), Body=data,
                    ContentType="application/json", ChecksumAlgorithm=self.checksum_algorithm,
                    **cond,
                )
        except PreconditionFailed:
            raise
        except PermanentTierError as exc:
            cause = exc.__cause__
            if cond and isinstance(cause, bce.ClientError) and (
                _code(cause) == "NotImplemented" or _status(cause) == 501
            ):
                raise ConditionalWriteUnsupported(
                    f"tier {self.name}: the server does not support conditional writes: {exc}"
                ) from exc
            raise
        return str(resp.get("ETag") or "")

    def fence(self, reason: str | None, *, permanent: bool = False) -> None:
        """Refuse every write (put, delete, put_meta) with ``reason`` until called with None.
        ``permanent``: raise PermanentTierError (another node holds the writer lease) rather
        than TransientTierError (the lease is not taken yet; worth retrying). Any thread:
        one assignment, read once by each write's check (the writer lease serialises its
        own decisions to fence, upload/lease.py)."""
        self._fence = None if reason is None else (reason, permanent)

    @property
    def fenced(self) -> str | None:
        fence = self._fence
        return None if fence is None else fence[0]

    def _check_fence(self, op: str, key: str) -> None:
        fence = self._fence
        if fence is not None:
            reason, permanent = fence
            cls = PermanentTierError if permanent else TransientTierError
            raise cls(f"tier {self.name}: {op} {key[:16]} refused: {reason}")

    def close(self) -> None:
        """Close the connection pool (the tier must not be used afterwards)."""
        with contextlib.suppress(Exception):
            self._client.close()
        if self._probe_client is not None:
            with contextlib.suppress(Exception):
                self._probe_client.close()
