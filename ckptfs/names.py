"""Names are bytes (docs/semantics.md "Names"). A name need not be UTF-8; inside the daemon
a path is a str whose undecodable bytes are surrogate escapes (U+DC80..U+DCFF, Python's
``surrogateescape``). Such a str cannot be written as UTF-8, nor stored in SQLite's or
PostgreSQL's TEXT, so wherever a path leaves the daemon:

* a path the catalog matches on (``checkpoints.root``) is stored as its bytes (BLOB/BYTEA):
  every name round-trips exactly (``path_bytes``, ``path_str``);
* text that people read (a checkpoint's ``reason``, an audit record's path, a log line, a
  metric's label) has each undecodable byte written ``\\xNN`` (``readable``);
* JSON (``ckptfs ls --json``, ``status --json``, ``audit tail --json``) is ASCII with the
  surrogate escapes as ``\\udcNN``: ``os.fsencode(json.loads(...))`` gives the bytes back;
* a command's plain-text output writes the name's own bytes (cli.py sets stdout's errors
  to ``surrogateescape``), as ls does into a pipe.
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
