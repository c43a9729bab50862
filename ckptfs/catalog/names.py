"""Paths as the catalog stores them. A name is bytes and need not be UTF-8; inside the
daemon a path is a str whose undecodable bytes are surrogate escapes (U+DC80..U+DCFF,
Python's ``surrogateescape``). Neither SQLite's nor PostgreSQL's TEXT can hold those, so:

* a path the catalog matches on (``checkpoints.root``) is stored as its bytes (BLOB/BYTEA):
  every name round-trips exactly;
* free text that only people read (a checkpoint's ``reason``, an audit record's path) is
  stored with each undecodable byte written ``\\xNN`` (``readable``).
"""

from __future__ import annotations

__all__ = ["path_bytes", "path_str", "readable"]


def path_bytes(path: str) -> bytes:
    """The bytes a daemon path names (the inverse of ``path_str``)."""
    return path.encode("utf-8", "surrogateescape")


def path_str(value: object) -> str:
    """A stored path column back as a daemon path (bytes of this schema; a str of a row
    an older ckptfs wrote and the migration has not seen is taken as it is)."""
    if isinstance(value, str):
        return value
    return bytes(value).decode("utf-8", "surrogateescape")  # type: ignore[call-overload]


def readable(text: str) -> str:
    """``text`` as valid UTF-8: each surrogate-escaped byte written ``\\xNN`` (another
    lone surrogate, which no name makes, as ``\\udNNN``)."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
