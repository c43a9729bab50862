"""Test tiers shipped with the package: an in-memory tier and a fault-injecting wrapper."""

from __future__ import annotations

import base64
import hashlib
import threading
from collections.abc import Iterator, Sequence

from ..codec.frame import Buffer
from ..errors import NoSpace, TierError, TransientTierError
from ..tiers.base import Tier, TierUsage, verify_by_reading


def _sha256_b64(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


class MemoryTier:
    kind = "local"
    verified_put = False
    request_grace_s = 0.0

    def __init__(
        self, name: str = "mem", capacity: int = 1 << 40, location: str = "local",
        kind: str = "local",
    ) -> None:
        self.kind = kind
        self.name = name
        self.location = location
        self.weight = 1.0
        self.capacity = capacity
        self.frames: dict[str, bytes] = {}
        self.metas: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def _used(self) -> int:
        return sum(len(v) for v in self.frames.values())

    def put(self, key: str, parts: Sequence[Buffer], expected_sha256: str | None = None) -> int:
        data = b"".join(bytes(p) for p in parts)
        if expected_sha256 is not None and _sha256_b64(data) != expected_sha256:
            raise TransientTierError(f"tier {self.name}: BadDigest (body changed in transit)")
        with self._lock:
            if self._used() + len(data) > self.capacity:
                raise NoSpace(f"tier {self.name}: full")
            self.frames[key] = data
        return len(data)

    def get(self, key: str) -> bytes | None:
        return self.frames.get(key)

    def has(self, key: str) -> bool:
        return key in self.frames

    def verify(self, key: str, digest: bytes) -> None:
        verify_by_reading(self, key, digest)

    def delete(self, key: str) -> int:
        with self._lock:
            data = self.frames.pop(key, None)
        return 0 if data is None else len(data)

    def sync(self, keys: Sequence[str]) -> None:
        return None

    def put_meta(self, name: str, data: bytes) -> None:
        self.metas[name] = bytes(data)

    def get_meta(self, name: str) -> bytes | None:
        return self.metas.get(name)

    def list_keys(self) -> Iterator[str]:
        yield from list(self.frames)

    def usage(self) -> TierUsage:
        used = self._used()
        return TierUsage(total=self.capacity, free=self.capacity - used, used=used, device=id(self), capped=True)

    def check(self) -> None:
        return None


class FaultyTier:
    """Wraps a tier; each fault switch makes the matching calls fail like a broken device."""

    def __init__(self, inner: Tier) -> None:
        self.inner = inner
        self.name = inner.name
        self.kind = inner.kind
        self.location = inner.location
        self.weight = inner.weight
        # Always checked by verify against the digest: a put this wrapper corrupts would
        # pass the inner tier's own compare with what it was handed.
        self.verified_put = False
        self.request_grace_s = inner.request_grace_s
        self.fail_puts = False
        self.fail_gets = False
        self.full = False
        self.corrupt_gets = False
        self.corrupt_puts = False  # flip a bit of every put body after the caller checked it
        self.corrupted = 0
        self.fail_deletes = False
        # Raised by every delete (before the inner tier's): e.g. an error in doubt (a
        # timeout after the DELETE was sent) or one the server answered (403).
        self.delete_error: TierError | None = None
        self.fail_syncs = False  # fsync of frames fails (a device losing writes)
        # Hold puts (chunks and meta) until the gate opens; put_entered tells a put is held.
        self.put_gate: threading.Event | None = None
        self.put_entered = threading.Event()
        # Hold gets (of ``gate_keys``, or of every key when None) until the gate opens
        # (a hung object store, a slow device); ``gets_held`` counts the gets held now.
        self.get_gate: threading.Event | None = None
        self.gate_keys: set[str] | None = None
        self.gets_held = 0
        # Hold deletes until the gate opens; ``delete_held`` tells a delete is held.
        self.hold_deletes: threading.Event | None = None
        self.delete_held = threading.Event()
        self._held_lock = threading.Lock()

    def _hold(self) -> None:
        self.put_entered.set()
        if self.put_gate is not None and not self.put_gate.wait(timeout=60):
            raise TierError(f"tier {self.name}: put gate never opened")

    def put(self, key: str, parts: Sequence[Buffer], expected_sha256: str | None = None) -> int:
        self._hold()
        if self.corrupt_puts:
            self.corrupted += 1
            damaged = bytearray(b"".join(bytes(p) for p in parts))
            damaged[len(damaged) // 2] ^= 0x01  # one bit flipped on the wire
            parts = [bytes(damaged)]
        if self.full:
            raise NoSpace(f"tier {self.name}: injected ENOSPC")
        if self.fail_puts:
            raise TierError(f"tier {self.name}: injected EIO on put")
        return self.inner.put(key, parts, expected_sha256)

    def _hold_get(self, key: str) -> None:
        gate = self.get_gate
        if gate is None or (self.gate_keys is not None and key not in self.gate_keys):
            return
        with self._held_lock:
            self.gets_held += 1
        try:
            if not gate.wait(timeout=60):
                raise TierError(f"tier {self.name}: get gate never opened")
        finally:
            with self._held_lock:
                self.gets_held -= 1

    def get(self, key: str) -> Buffer | None:
        self._hold_get(key)
        if self.fail_gets:
            raise TierError(f"tier {self.name}: injected EIO on get")
        data = self.inner.get(key)
        if data is not None and self.corrupt_gets:
            flipped = bytearray(data)
            flipped[-1] ^= 0xFF
            return bytes(flipped)
        return data

    def has(self, key: str) -> bool:
        if self.fail_gets:
            raise TierError(f"tier {self.name}: injected EIO on get")
        return self.inner.has(key)

    def verify(self, key: str, digest: bytes) -> None:
        verify_by_reading(self, key, digest)

    def delete(self, key: str) -> int:
        gate = self.hold_deletes
        if gate is not None:
            self.delete_held.set()
            if not gate.wait(timeout=60):
                raise TierError(f"tier {self.name}: delete gate never opened")
        if self.delete_error is not None:
            raise self.delete_error
        if self.fail_deletes:
            raise TierError(f"tier {self.name}: injected EIO on delete")
        return self.inner.delete(key)

    def sync(self, keys: Sequence[str]) -> None:
        if self.fail_syncs:
            raise TierError(f"tier {self.name}: injected EIO on fsync")
        self.inner.sync(keys)

    def put_meta(self, name: str, data: bytes) -> None:
        self._hold()
        if self.fail_puts:
            raise TierError(f"tier {self.name}: injected EIO on put")
        self.inner.put_meta(name, data)  # type: ignore[attr-defined]

    def get_meta(self, name: str) -> bytes | None:
        if self.fail_gets:
            raise TierError(f"tier {self.name}: injected EIO on get")
        return self.inner.get_meta(name)  # type: ignore[attr-defined]

    def list_keys(self) -> Iterator[str]:
        return self.inner.list_keys()

    def usage(self) -> TierUsage:
        return self.inner.usage()

    def check(self) -> None:
        self.inner.check()
