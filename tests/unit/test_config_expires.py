"""``[[namespace]] expires``: an encrypted namespace's end, when its keys are shredded
(docs/governance.md, "Encryption at rest and keys"). Errors name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptfs.config import Config, load_config
from ckptfs.errors import ConfigError

NS = """
[keys]
kek_file = "/etc/ckptfs/kek"
[[tier]]
name = "nvme0"
kind = "local"
path = "/nvme0/ckptfs"
[[namespace]]
path = "/proj-a"
uids = [1]
"""


def _load(tmp_path: Path, text: str) -> Config:
    p = tmp_path / "ckptfs.toml"
    p.write_text(f'state_dir = "{tmp_path}/state"\n' + NS + text)
    return load_config(str(p))


@pytest.mark.parametrize("value", ["2027-06-30T00:00:00Z", '"2027-06-30T02:00:00+02:00"'])
def test_an_encrypted_namespace_expires_at_a_given_instant(tmp_path: Path, value: str) -> None:
    cfg = _load(tmp_path, f"encrypt = true\nexpires = {value}\n")
    ns, = cfg.governance.namespaces
    assert ns.expires_ns == 1_814_313_600 * 10**9


@pytest.mark.parametrize(("text", "why"), [
    ("expires = 2027-06-30T00:00:00Z\n", "only an encrypted namespace expires"),
    ("encrypt = true\nexpires = 2027-06-30T00:00:00\n", "with its offset"),
    ("encrypt = true\nexpires = \"soon\"\n", "with its offset"),
])
def test_a_bad_expiry_is_refused_naming_the_key(tmp_path: Path, text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=r"namespace\[0\]\.expires") as info:
        _load(tmp_path, text)
    assert why in str(info.value)
