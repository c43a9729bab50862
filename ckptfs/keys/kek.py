"""The key-encryption key: 32 bytes from a key file or from a command (a KMS hook).

The file must be a regular file of exactly 32 bytes, mode 0600 or stricter (no group or
other bits): a KEK anyone else can read protects nothing. The command runs once at mount,
without a shell, and must print 32 raw bytes or 64 hex digits. Errors are ConfigErrors
naming the key (``ckptfs mount`` exits 2) and never carry key bytes.
"""

from __future__ import annotations

import os
import shlex
import stat
import subprocess

import blake3

from ..config.model import KeysConfig
from ..errors import ConfigError

KEK_SIZE = 32
COMMAND_TIMEOUT_S = 60.0


def load_kek(keys: KeysConfig) -> bytes:
    """The KEK ``keys`` names (blocking: file I/O or a subprocess)."""
    if keys.kek_file is not None:
        return _from_file(str(keys.kek_file))
    if keys.kek_command is not None:
        return _from_command(keys.kek_command)
    raise ConfigError("keys: an encrypted namespace needs kek_file or kek_command")


def _from_file(path: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"keys.kek_file: cannot open {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"keys.kek_file: {path} is not a regular file")
        if st.st_mode & 0o077:
            raise ConfigError(
                f"keys.kek_file: {path} has mode {stat.S_IMODE(st.st_mode):04o}; it must be "
                f"0600 or stricter (chmod 600 {path})"
            )
        if st.st_size != KEK_SIZE:
            raise ConfigError(f"keys.kek_file: {path} is {st.st_size} bytes; a KEK is "
                              f"{KEK_SIZE} random bytes (head -c 32 /dev/urandom)")
        data = os.read(fd, KEK_SIZE + 1)
    finally:
        os.close(fd)
    if len(data) != KEK_SIZE:
        raise ConfigError(f"keys.kek_file: {path}: read {len(data)} bytes, expected {KEK_SIZE}")
    return data


def _from_command(command: str) -> bytes:
    try:
        done = subprocess.run(shlex.split(command), capture_output=True, timeout=COMMAND_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"keys.kek_command: could not run it: {exc}") from None
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip().splitlines()
        raise ConfigError(f"keys.kek_command: exited with status {done.returncode}"
                          + (f": {err[-1][:200]}" if err else ""))
    out = done.stdout
    if len(out) == KEK_SIZE:
        return out
    text = out.strip()
    if len(text) == 2 * KEK_SIZE:
        try:
            return bytes.fromhex(text.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            pass
    raise ConfigError(f"keys.kek_command: printed {len(out)} bytes; expected {KEK_SIZE} raw "
                      f"bytes or {2 * KEK_SIZE} hex digits")


def kek_id(kek: bytes) -> str:
    """A fingerprint of a KEK (names it in the catalog and in messages; reveals nothing)."""
    return blake3.blake3(b"ckptfs kek id", key=kek).hexdigest()[:16]
