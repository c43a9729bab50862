"""The key-encryption key (keys/kek.py) and wrapped data keys (keys/wrap.py): a KEK file
must be 32 bytes and private, a command prints 32 raw bytes or 64 hex digits, a wrapped
key opens only with its KEK, namespace and version, and no message carries key bytes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ckptfs.catalog.keys import KeyRow
from ckptfs.config.model import KeysConfig
from ckptfs.errors import ConfigError
from ckptfs.keys.kek import kek_id, load_kek
from ckptfs.keys.wrap import unwrap, wrap

KEK = bytes(range(32))


def _kek_file(tmp_path: Path, data: bytes = KEK, mode: int = 0o600) -> Path:
    p = tmp_path / "kek"
    p.write_bytes(data)
    p.chmod(mode)
    return p


def test_a_private_32_byte_file_is_the_kek(tmp_path: Path) -> None:
    assert load_kek(KeysConfig(kek_file=_kek_file(tmp_path))) == KEK
    assert load_kek(KeysConfig(kek_file=_kek_file(tmp_path, mode=0o400))) == KEK


@pytest.mark.parametrize(("data", "mode", "why"), [
    (KEK, 0o644, "mode 0644"), (KEK, 0o640, "mode 0640"), (KEK[:31], 0o600, "31 bytes"),
    (KEK + b"\n", 0o600, "33 bytes"),
])
def test_a_readable_or_wrong_sized_key_file_is_refused_naming_the_key(
    tmp_path: Path, data: bytes, mode: int, why: str,
) -> None:
    with pytest.raises(ConfigError, match="keys.kek_file") as info:
        load_kek(KeysConfig(kek_file=_kek_file(tmp_path, data, mode)))
    assert why in str(info.value) and KEK.hex() not in str(info.value)


def test_a_missing_key_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="keys.kek_file: cannot open"):
        load_kek(KeysConfig(kek_file=tmp_path / "none"))


def _command(tmp_path: Path, output: bytes, status: int = 0) -> str:
    out = tmp_path / "out"
    out.write_bytes(output)
    code = f"import sys; sys.stdout.buffer.write(open({str(out)!r}, 'rb').read()); sys.exit({status})"
    script = tmp_path / "kms.py"
    script.write_text(code)
    return f"{sys.executable} {script}"


def test_a_command_prints_raw_or_hex_key_bytes(tmp_path: Path) -> None:
    assert load_kek(KeysConfig(kek_command=_command(tmp_path, KEK))) == KEK
    assert load_kek(KeysConfig(kek_command=_command(tmp_path, KEK.hex().encode() + b"\n"))) == KEK


@pytest.mark.parametrize(("output", "status", "why"), [
    (b"short", 0, "printed 5 bytes"), (KEK, 3, "status 3"), (b"zz" * 32, 0, "printed 64"),
])
def test_a_failing_command_is_refused_naming_the_key(
    tmp_path: Path, output: bytes, status: int, why: str,
) -> None:
    with pytest.raises(ConfigError, match="keys.kek_command") as info:
        load_kek(KeysConfig(kek_command=_command(tmp_path, output, status)))
    assert why in str(info.value)


def _row(blob: bytes, ns: str = "/a", version: int = 1) -> KeyRow:
    return KeyRow(5, ns, version, blob, kek_id(KEK), 0, None)


def test_a_wrapped_key_opens_only_with_its_kek_namespace_and_version() -> None:
    dk, ik = os.urandom(32), os.urandom(32)
    blob = wrap(KEK, "/a", 1, dk, ik)
    assert dk not in blob and ik not in blob
    key = unwrap(KEK, _row(blob))
    assert (key.key_id, key.namespace, key.version, key.data_key, key.id_key) == (5, "/a", 1, dk, ik)
    other = os.urandom(32)
    with pytest.raises(ConfigError, match="does not unwrap with this KEK") as info:
        unwrap(other, _row(blob))
    assert kek_id(other) in str(info.value) and other.hex() not in str(info.value)
    with pytest.raises(ConfigError):
        unwrap(KEK, _row(blob, ns="/b"))  # moved to another namespace's row
    with pytest.raises(ConfigError):
        unwrap(KEK, _row(blob, version=2))
