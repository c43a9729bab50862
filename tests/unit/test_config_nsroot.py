"""A namespace root's ``owner``, ``group`` and ``mode`` in the config (config/nsroot.py):
their defaults, names and numbers, and every bad value refused naming its key."""

from __future__ import annotations

import grp
import pwd
from pathlib import Path

import pytest

from ckptfs.config import load_config
from ckptfs.errors import ConfigError


def namespaces(tmp_path: Path, text: str) -> list[tuple[int | None, int | None, int | None]]:
    p = tmp_path / "ckptfs.toml"
    p.write_text(f'state_dir = "{tmp_path}/state"\n' + text)
    return [(n.root_uid, n.root_gid, n.root_mode) for n in load_config(p).governance.namespaces]


def test_defaults_first_uid_and_gid_0700_or_0770_with_groups(tmp_path: Path) -> None:
    root_user = pwd.getpwuid(0)
    assert namespaces(tmp_path, """
[[namespace]]
path = "/a"
uids = [4201, 4200]
gids = [4302]
[[namespace]]
path = "/b"
gids = [4303]
[[namespace]]
path = "/c"
uids = [0]
""") == [(4200, 4302, 0o770), (0, 4303, 0o770), (0, root_user.pw_gid, 0o700)]


def test_owner_group_mode_by_name_and_number(tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    group = grp.getgrgid(nobody.pw_gid).gr_name
    assert namespaces(tmp_path, f"""
[[namespace]]
path = "/a"
uids = [{nobody.pw_uid}]
owner = "nobody"
group = "{group}"
mode = "0750"
[[namespace]]
path = "/b"
uids = [4201]
gids = [4302]
owner = 4201
group = "4302"
mode = "2770"
[[namespace]]
path = "/c"
gids = [4302]
mode = "0o700"
""") == [(nobody.pw_uid, nobody.pw_gid, 0o750), (4201, 4302, 0o2770), (0, 4302, 0o700)]


# Namespace path uids (with a line of its own to add), and the error's key and words.
BAD = [
    ('owner = "no-such-user-ckptfs"', "namespace[0].owner", "no user named"),
    ('group = "no-such-group-ckptfs"', "namespace[0].group", "no group named"),
    ("owner = -1", "namespace[0].owner", "expected an id"),
    ("owner = 4294967295", "namespace[0].owner", "expected an id"),
    ("group = true", "namespace[0].group", "group name or a numeric id"),
    ("owner = [1]", "namespace[0].owner", "user name or a numeric id"),
    ("mode = 750", "namespace[0].mode", "octal mode as a string"),
    ('mode = "0799"', "namespace[0].mode", "octal mode"),
    ('mode = "17777"', "namespace[0].mode", "octal mode"),
    ('mode = ""', "namespace[0].mode", "octal mode"),
    ("owner = 4242", "namespace[0].owner", "neither an owner of the namespace"),
    ("group = 4242\nowner = 4242", "namespace[0].owner", "neither an owner"),
]


@pytest.mark.parametrize(("line", "key", "words"), BAD)
def test_bad_root_keys_name_the_key(tmp_path: Path, line: str, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as exc:
        namespaces(tmp_path, f'[[namespace]]\npath = "/a"\nuids = [4201]\n{line}\n')
    assert str(exc.value).startswith(key + ":"), exc.value
    assert words in str(exc.value)
