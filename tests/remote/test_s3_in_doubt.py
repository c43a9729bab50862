"""Which S3 failures leave a request in doubt (``TierError.in_doubt``): sent, perhaps, and
no answer read, so a DELETE may still land. The mapping over the exceptions botocore and
urllib3 raise, then the same through real HTTP: a small server on 127.0.0.1 that answers,
stalls or hangs up exactly where each case needs it, and a port nothing listens on."""

from __future__ import annotations

import errno
import http.server
import socket
import threading
from collections.abc import Iterator
from typing import Any

import boto3
import botocore.exceptions as bce
import pytest
import urllib3
import urllib3.connection
import urllib3.exceptions

from ckptfs.config import S3TierConfig
from ckptfs.errors import (
    AccessDenied,
    EndpointUnreachable,
    PermanentTierError,
    TierError,
    TransientTierError,
)
from ckptfs.tiers.local import LocalTier
from ckptfs.tiers.s3 import REQUEST_GRACE_FACTOR, S3Tier

KEY = "ab" * 32


def _session() -> Any:
    return boto3.session.Session(
        aws_access_key_id="offline", aws_secret_access_key="offline", region_name="us-east-1"
    )


def _client_error(code: str, status: int) -> bce.ClientError:
    return bce.ClientError(
        {"Error": {"Code": code, "Message": f"{code} happened"},
         "ResponseMetadata": {"HTTPStatusCode": status}},
        "DeleteObject",
    )


def _tier(endpoint: str, read_timeout: float = 5.0) -> S3Tier:
    return S3Tier(S3TierConfig(name="t", bucket="b-ckptfs", endpoint_url=endpoint,
                               addressing_style="path"),
                  session=_session(), connect_timeout=2, read_timeout=read_timeout)


@pytest.fixture
def offline_tier() -> Iterator[S3Tier]:
    t = _tier("http://127.0.0.1:9")
    yield t
    t.close()


# (what botocore or urllib3 raised, the error it becomes, in doubt)
MAPPING: list[tuple[BaseException, type[TierError], bool]] = [
    # The server answered: the request is finished, whatever the status.
    (_client_error("AccessDenied", 403), AccessDenied, False),
    (_client_error("NoSuchKey", 404), PermanentTierError, False),
    (_client_error("InternalError", 500), TransientTierError, False),
    (_client_error("SlowDown", 503), TransientTierError, False),
    (_client_error("RequestTimeout", 400), TransientTierError, False),
    (bce.FlexibleChecksumError(error_msg="mismatch"), TransientTierError, False),
    # Nothing was sent: no connection was made, or no request built.
    (bce.EndpointConnectionError(endpoint_url="http://x"), EndpointUnreachable, False),
    (bce.ConnectTimeoutError(endpoint_url="http://x"), EndpointUnreachable, False),
    (bce.ProxyConnectionError(proxy_url="http://p"), EndpointUnreachable, False),
    (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), EndpointUnreachable, False),
    (urllib3.exceptions.NewConnectionError(urllib3.connection.HTTPConnection("127.0.0.1", 9),
                                           "refused"), EndpointUnreachable, False),
    (urllib3.exceptions.ConnectTimeoutError("connect timed out"), EndpointUnreachable, False),
    (bce.NoCredentialsError(), AccessDenied, False),
    (bce.ParamValidationError(report="bad"), PermanentTierError, False),
    (bce.SSLError(endpoint_url="https://x", error="certificate verify failed"),
     PermanentTierError, False),
    # Sent, perhaps, and no answer read: in doubt.
    (bce.ReadTimeoutError(endpoint_url="http://x"), TransientTierError, True),
    (bce.ConnectionClosedError(endpoint_url="http://x"), TransientTierError, True),
    (bce.ResponseStreamingError(error="reset"), TransientTierError, True),
    (bce.HTTPClientError(error="reset"), TransientTierError, True),
    (urllib3.exceptions.ProtocolError("Connection aborted."), TransientTierError, True),
    (urllib3.exceptions.ReadTimeoutError(urllib3.HTTPConnectionPool("127.0.0.1", 9), "/",
                                         "read timed out"), TransientTierError, True),
    (ConnectionResetError(errno.ECONNRESET, "reset"), TransientTierError, True),
    (BrokenPipeError(errno.EPIPE, "broken pipe"), TransientTierError, True),
    (TimeoutError("timed out"), TransientTierError, True),
    (bce.SSLError(endpoint_url="https://x", error="EOF occurred in violation of protocol"),
     TransientTierError, True),
    (bce.BotoCoreError(), TransientTierError, True),  # not known: not known unsent
]


@pytest.mark.parametrize(
    ("raised", "expected", "in_doubt"), MAPPING,
    ids=[f"{type(r).__name__}-{i}" for i, (r, _, _) in enumerate(MAPPING)],
)
def test_the_mapping_tells_which_failures_are_in_doubt(
    offline_tier: S3Tier, raised: BaseException, expected: type[TierError], in_doubt: bool
) -> None:
    with pytest.raises(expected) as ei, offline_tier._errors("delete", KEY):
        raise raised
    assert ei.value.in_doubt is in_doubt
    assert ei.value.__cause__ is raised


def test_a_request_that_changes_nothing_is_never_in_doubt(offline_tier: S3Tier) -> None:
    with pytest.raises(TransientTierError) as ei, offline_tier._errors(
        "delete", KEY, changes=False
    ):
        raise bce.ReadTimeoutError(endpoint_url="http://x")
    assert not ei.value.in_doubt


def test_a_fenced_delete_sent_nothing(offline_tier: S3Tier) -> None:
    offline_tier.fence("no writer lease")
    with pytest.raises(TransientTierError) as ei:
        offline_tier.delete(KEY)
    assert not ei.value.in_doubt


def test_the_grace_comes_from_the_tiers_timeouts(offline_tier: S3Tier) -> None:
    assert offline_tier.request_grace_s == REQUEST_GRACE_FACTOR * (2 + 5)
    assert LocalTier.request_grace_s == 0.0


# -- through real HTTP ---------------------------------------------------------------------


class _Server:
    """HEAD answers 200 with a length at once (unless ``stall_head``); DELETE does as
    ``delete`` says: "answer403", "stall" (read, then no answer until released) or
    "hangup" (read, then close the connection without a reply). ``deletes`` counts the
    DELETE requests received."""

    def __init__(self, delete: str, stall_head: bool = False) -> None:
        self.delete, self.stall_head = delete, stall_head
        self.deletes = 0
        self.release = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_HEAD(self) -> None:
                if outer.stall_head:
                    outer.release.wait(30)
                    self.close_connection = True
                    return
                self.send_response(200)
                self.send_header("Content-Length", "10")
                self.end_headers()

            def do_DELETE(self) -> None:
                outer.deletes += 1
                if outer.delete == "answer403":
                    body = (b"<?xml version='1.0'?><Error><Code>AccessDenied</Code>"
                            b"<Message>no</Message></Error>")
                    self.send_response(403)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if outer.delete == "stall":
                    outer.release.wait(30)
                self.close_connection = True  # "hangup", or a stall given up on

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> _Server:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


def _delete_error(endpoint: str, read_timeout: float = 5.0) -> TierError:
    t = _tier(endpoint, read_timeout)
    try:
        with pytest.raises(TierError) as ei:
            t.delete(KEY)
        return ei.value
    finally:
        t.close()


def test_a_delete_sent_and_not_answered_in_time_is_in_doubt() -> None:
    with _Server("stall") as server:
        err = _delete_error(server.endpoint, read_timeout=0.5)
        assert server.deletes == 1  # the DELETE reached the server
    assert isinstance(err, TransientTierError) and err.in_doubt
    assert isinstance(err.__cause__, bce.ReadTimeoutError)


def test_a_delete_whose_connection_closed_unanswered_is_in_doubt() -> None:
    with _Server("hangup") as server:
        err = _delete_error(server.endpoint)
        assert server.deletes == 1
    assert isinstance(err, TransientTierError) and err.in_doubt
    assert isinstance(err.__cause__, bce.ConnectionClosedError | bce.HTTPClientError)


def test_a_delete_answered_403_is_finished() -> None:
    with _Server("answer403") as server:
        err = _delete_error(server.endpoint)
        assert server.deletes == 1
    assert isinstance(err, AccessDenied) and not err.in_doubt


def test_a_stalled_head_before_the_delete_sent_no_delete() -> None:
    with _Server("answer403", stall_head=True) as server:
        err = _delete_error(server.endpoint, read_timeout=0.5)
        assert server.deletes == 0
    assert isinstance(err, TransientTierError) and not err.in_doubt


def test_a_refused_connection_sent_nothing() -> None:
    with socket.socket() as s:  # a port nothing listens on (bound, never listening)
        s.bind(("127.0.0.1", 0))
        err = _delete_error(f"http://127.0.0.1:{s.getsockname()[1]}")
    assert isinstance(err, EndpointUnreachable) and not err.in_doubt
