"""Faults in the writer-lease PUTs of an S3Tier, injected into its real boto3 client.

Botocore event hooks on the tier's client: every request still goes to the real server
(SeaweedFS) unless a fault answers it instead. ``LeasePutFaults(tier)`` affects only the
PUTs of the lease object (``<prefix>/meta/writer``)::

    faults.fail = 2        # the next 2 are answered with a 500 (the server never sees them)
    faults.lose = 1        # the next one lands, then its reply is lost (a read timeout)
    faults.gate = Event()  # the next ones hang before they are sent, until the gate is set
    faults.on_put = f      # called with each one's index before it is sent

``sent`` records each lease PUT's conditional headers, ``landed`` the ETags of those whose
reply was lost, ``answers`` the status each one got back (0: none, the reply was lost).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import botocore.exceptions as bce
from botocore.awsrequest import AWSResponse

from ckptfs.tiers.s3 import S3Tier
from ckptfs.upload.lease import LEASE_NAME

_INTERNAL_ERROR = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
    b"<Message>We encountered an internal error. Please try again.</Message></Error>"
)
GATE_TIMEOUT_S = 60.0  # a held PUT goes on by itself after this (a test that failed)


class _Body:
    """The raw body of an injected response (what botocore reads from ``raw.stream()``)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def stream(self, **_kw: Any) -> list[bytes]:
        return [self.data]


class LeasePutFaults:
    def __init__(self, tier: S3Tier) -> None:
        self.tier = tier
        self.key = (f"{tier.prefix}/meta/" if tier.prefix else "meta/") + LEASE_NAME
        self.fail = 0
        self.lose = 0
        self.gate: threading.Event | None = None
        self.held = threading.Event()  # set when a lease PUT waits at the gate
        self.on_put: Callable[[int], None] | None = None
        self.sent: list[dict[str, str]] = []
        self.answers: list[int] = []
        self.landed: list[str] = []
        self._lock = threading.Lock()
        events = tier.client.meta.events
        events.register("before-send.s3.PutObject", self._before_send)
        events.register("after-call.s3.PutObject", self._after_call)

    def close(self) -> None:
        events = self.tier.client.meta.events
        events.unregister("before-send.s3.PutObject", self._before_send)
        events.unregister("after-call.s3.PutObject", self._after_call)
        if self.gate is not None:
            self.gate.set()

    def _is_lease(self, url: str) -> bool:
        return url.split("?", 1)[0].endswith("/" + self.key)

    def _before_send(self, request: Any, **_kw: Any) -> AWSResponse | None:
        if not self._is_lease(str(request.url)):
            return None
        headers = {k: v.decode() if isinstance(v, bytes) else str(v)
                   for k, v in request.headers.items()
                   if k.lower() in ("if-match", "if-none-match")}
        with self._lock:
            index = len(self.sent)
            self.sent.append(headers)
            failing = self.fail > 0
            if failing:
                self.fail -= 1
        if self.on_put is not None:
            self.on_put(index)
        gate = self.gate
        if gate is not None:
            self.held.set()
            gate.wait(timeout=GATE_TIMEOUT_S)
        if failing:
            return AWSResponse(str(request.url), 500, {"Content-Type": "application/xml"},
                               _Body(_INTERNAL_ERROR))
        return None

    def _after_call(self, http_response: Any, parsed: dict[str, Any], **_kw: Any) -> None:
        if not self._is_lease(str(http_response.url)):
            return
        with self._lock:
            losing = self.lose > 0 and http_response.status_code < 300
            if losing:
                self.lose -= 1
                self.landed.append(str(parsed.get("ETag", "")))
            self.answers.append(0 if losing else int(http_response.status_code))
        if losing:  # the PUT landed; the client never hears so
            raise bce.ReadTimeoutError(endpoint_url=str(http_response.url))
