"""Daemon logging: levels everywhere, journald priorities, JSON lines on request, and no
credential ever written.

* ``STATE_DIR/ckptfs.log``: ``TIME LEVEL LOGGER: message`` lines.
* stderr under systemd (``$JOURNAL_STREAM`` names our stderr): ``<PRIORITY>LOGGER: message``,
  so journald records each line's level (``journalctl -u ckptfs -p warning``) and its own
  timestamp; ``--log-format json`` prints one JSON object per line instead (time, level,
  logger, message) for log shippers.
* Every line (and traceback) passes ``redact``: AWS key ids, secret keys, session tokens,
  passwords, presigned-URL signatures, Authorization headers and URL user:password parts
  are replaced by ``***``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from pathlib import Path

from .names import readable
from .statedir import touch_private

_SECRET_PATTERNS = [
    # key=value or key: value for names that hold secrets (also quoted JSON/dict style)
    (re.compile(
        r"""(?i)(["']?\b(?:aws_)?(?:secret(?:_access)?_key|secretaccesskey|session_?token|"""
        r"""security_?token|password|passwd|api_?key|access_?token)["']?\s*[:=]\s*["']?)"""
        r"""([^\s"',;&}]+)"""), r"\1***"),
    # presigned URL query parameters
    (re.compile(r"(?i)(X-Amz-(?:Signature|Credential|Security-Token)=)[^&\s\"']+"), r"\1***"),
    # Authorization headers
    (re.compile(r"(?i)(Authorization['\"]?\s*[:=]\s*['\"]?)[^\n'\"]+"), r"\1***"),
    # AWS access key ids
    (re.compile(r"\b((?:AKIA|ASIA|AROA|AIDA)[A-Z0-9]{4})[A-Z0-9]{12}\b"), r"\1***"),
    # user:password@ in URLs
    (re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s:@]+:[^\s@]+@"), r"\1***@"),
]


def redact(text: str) -> str:
    """``text`` with anything that looks like a credential replaced by ``***``."""
    for pattern, repl in _SECRET_PATTERNS:
        text = pattern.sub(repl, text)
    return text


class RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        # A name that is not UTF-8 (names.py): its bytes as \xNN, or the line could not
        # be written (UnicodeEncodeError in the handler: the line lost).
        return readable(redact(super().format(record)))


def _priority(levelno: int) -> int:
    if levelno >= logging.CRITICAL:
        return 2
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    if levelno >= logging.INFO:
        return 6
    return 7


class JournalFormatter(RedactingFormatter):
    """``<PRIORITY>logger: message``: journald takes the level from the prefix."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        prefix = f"<{_priority(record.levelno)}>"
        return "\n".join(prefix + line for line in text.splitlines() or [""])


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": readable(redact(record.getMessage())),
        }
        if record.exc_info:
            entry["exception"] = readable(redact(self.formatException(record.exc_info)))
        return json.dumps(entry, ensure_ascii=False)


def stderr_is_journal() -> bool:
    """True when systemd connected our stderr to the journal (``$JOURNAL_STREAM``)."""
    value = os.environ.get("JOURNAL_STREAM", "")
    dev, _, ino = value.partition(":")
    if not dev.isdigit() or not ino.isdigit():
        return False
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return st.st_dev == int(dev) and st.st_ino == int(ino)


FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup(level: str, log_path: Path | None, to_stderr: bool, fmt: str = "text") -> None:
    """Configure the root logger for the daemon (``fmt``: "text" or "json" on stderr)."""
    handlers: list[logging.Handler] = []
    if log_path is not None:
        touch_private(log_path)  # 0600: the log names files and owners of the mount
        fh = logging.FileHandler(log_path)
        fh.setFormatter(RedactingFormatter(FILE_FORMAT))
        handlers.append(fh)
    if to_stderr:
        sh = logging.StreamHandler(sys.stderr)
        if fmt == "json":
            sh.setFormatter(JsonFormatter())
        elif stderr_is_journal():
            sh.setFormatter(JournalFormatter("%(name)s: %(message)s"))
        else:
            sh.setFormatter(RedactingFormatter(FILE_FORMAT))
        handlers.append(sh)
    logging.basicConfig(level=getattr(logging, level), handlers=handlers, force=True)
