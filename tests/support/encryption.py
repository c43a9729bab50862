"""Helpers for the encryption-at-rest tests: a KEK file, a config with encrypted and plain
namespaces, raw frames on the local tiers, and the namespace keys as the catalog holds
them (unwrapped here, so a test can look for key bytes where none must be)."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path

from ckptfs.catalog import Catalog, SqliteCatalog
from ckptfs.codec import frame
from ckptfs.codec.seal import SealKey
from ckptfs.keys.ring import live_keys

MiB = 1 << 20
# A pattern no random data contains: what a plaintext search looks for in raw frames.
MARKER = b"CKPTFS-PLAINTEXT-MARKER-"


def marked(size: int, salt: bytes = b"") -> bytes:
    unit = MARKER + salt + b"|"
    return (unit * (size // len(unit) + 1))[:size]


def kek_file(where: Path, data: bytes | None = None, mode: int = 0o600) -> tuple[Path, bytes]:
    kek = os.urandom(32) if data is None else data
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_bytes(kek)
    where.chmod(mode)
    return where, kek


def config(path: Path, kek: Path | None, encrypted: Sequence[str] = ("/proj-a", "/proj-b"),
           plain: Sequence[str] = ("/open",), extra: str = "") -> Path:
    text = extra
    if kek is not None:
        text += f'[keys]\nkek_file = "{kek}"\n'
    for ns in encrypted:
        text += f'[[namespace]]\npath = "{ns}"\nuids = [0]\nencrypt = true\n'
    for ns in plain:
        text += f'[[namespace]]\npath = "{ns}"\nuids = [0]\n'
    path.write_text(text)
    return path


def frames(tiers: Sequence[Path]) -> dict[str, bytes]:
    """Every chunk frame on these local tiers, by hex chunk id."""
    return {p.name: p.read_bytes() for t in tiers for p in (t / "chunks").glob("*/*")}


def frame_path(tiers: Sequence[Path], key: str) -> Path:
    for t in tiers:
        for p in (t / "chunks").glob(f"*/{key}"):
            return p
    raise AssertionError(f"no frame {key[:16]} on {tiers}")


def write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for off in range(0, len(data), MiB):
            f.write(data[off : off + MiB])


def open_catalog(state_dir: Path) -> Catalog:
    return SqliteCatalog(state_dir / "catalog.sqlite", readonly=True)


def chunk_ids(catalog: Catalog, path: Path) -> set[str]:
    return {r.digest.hex() for r in catalog.extents(os.stat(path).st_ino).values()}


def keys_of(catalog: Catalog, kek: bytes) -> list[SealKey]:
    return live_keys(kek, catalog.namespace_keys())


def key_ids(raw: dict[str, bytes], ids: set[str]) -> set[int]:
    return {frame.parse_header(raw[k]).key_id for k in ids}


def read_is_eio(path: Path) -> bool:
    """Reading ``path`` fails with EIO (True) or succeeds (False); any other error fails
    the test."""
    try:
        path.read_bytes()
    except OSError as exc:
        assert exc.errno == errno.EIO, exc
        return True
    return False
