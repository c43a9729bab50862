"""Namespaces provisioned by the config (docs/governance.md, "Provisioned roots"): a
declared namespace's missing root is made at mount with the config's owner, group and mode,
so that its user works in it as a new operator's would: the mount root as ckptfs makes it
(root's, 0755, not sticky 1777) and no admin group. A root that exists with other owners is
left alone, reported with one WARNING and in `ckptfs status`; bad keys exit 2."""

from __future__ import annotations

import errno
import json
import os
import pwd
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TEST_MOUNT_ARGS
from tests.mount.test_namespaces import ADMIN, GROUP, MEMBER, OWNER, STRANGER, cli_as
from tests.mount.test_posix_perms import as_user, needs_root
from tests.support.mountutil import Mount, mounted, run_cli

USER = pwd.getpwnam("nobody")  # a user of this host, named in the config
# ADMIN: the operator running `ckptfs status` (root sees no namespace without it)

CONFIG = f"""
[access]
admin_gids = [{ADMIN}]

[[namespace]]
path = "/proj-a"
uids = [{OWNER}]

[[namespace]]
path = "/teams/b"
gids = [{GROUP}]
mode = "2770"

[[namespace]]
path = "/named"
uids = [{USER.pw_uid}]
owner = "{USER.pw_name}"
mode = "0750"
"""


@contextmanager
def config_mount(config: str, base: Path | None = None) -> Iterator[Mount]:
    """A mount with ``config`` under a directory other users may traverse (a test's
    tmp_path is root's own); the mount root is left as ckptfs makes it."""
    made = base is None
    base = base or Path(tempfile.mkdtemp(prefix="ckptfs-nsroot-"))
    try:
        base.chmod(0o755)
        cfg = base / "ckptfs.toml"
        cfg.write_text(config)
        with mounted(base, 1, (*TEST_MOUNT_ARGS, "--config", str(cfg))) as m:
            yield m
    finally:
        if made:
            shutil.rmtree(base, ignore_errors=True)


def owner_mode(p: Path) -> tuple[int, int, int]:
    st = os.lstat(p)
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


def status_of(m: Mount, *args: str) -> str:
    """`ckptfs status` as root in an admin group (root alone sees no namespace)."""
    res = cli_as(m.mountpoint, 0, "status", str(m.mountpoint), *args, groups=(ADMIN,))
    assert res.returncode == 0, res.stderr
    return res.stdout


def status_roots(m: Mount) -> dict[str, Any]:
    return {n["path"]: n["root"] for n in json.loads(status_of(m, "--json"))["namespaces"]}


@needs_root
def test_missing_roots_are_made_so_their_users_write_without_a_sticky_root() -> None:
    with config_mount(CONFIG) as m:
        mp = m.mountpoint
        # The mount root as ckptfs makes it: root's, 0755, not sticky; no admin group.
        assert owner_mode(mp) == (0, 0, 0o755)
        assert owner_mode(mp / "proj-a") == (OWNER, 0, 0o700)
        assert owner_mode(mp / "teams") == (0, 0, 0o755)  # on the way: root's
        assert owner_mode(mp / "teams" / "b") == (0, GROUP, 0o2770)
        assert owner_mode(mp / "named") == (USER.pw_uid, USER.pw_gid, 0o750)
        # The namespaces' users work in them at once, as a new operator's would.
        assert as_user(mp, OWNER, OWNER, [
            "os.makedirs('proj-a/run/checkpoint-1')",
            "open('proj-a/run/checkpoint-1/model.bin', 'wb').write(b'w' * 300000)",
            "assert open('proj-a/run/checkpoint-1/model.bin', 'rb').read() == b'w' * 300000",
        ]) == [0, 0, 0]
        assert as_user(mp, MEMBER, MEMBER, [
            "open('teams/b/f', 'w').write('b')",
            f"assert os.stat('teams/b/f').st_gid == {GROUP}",  # the setgid mode given
        ], groups=(GROUP,)) == [0, 0]
        assert as_user(mp, USER.pw_uid, USER.pw_gid, ["open('named/f', 'w').write('n')"]) == [0]
        # Others get nothing (and the mount root is not theirs to write either).
        assert as_user(mp, STRANGER, STRANGER, [
            "os.listdir('proj-a')", "open('teams/b/x', 'w')", "os.mkdir('proj-c')",
            "os.stat('proj-a')",
        ]) == [errno.EACCES, errno.EACCES, errno.EACCES, 0]
        roots = status_roots(m)
        assert roots["/proj-a"]["root"] == {"uid": OWNER, "gid": 0, "mode": "0700"}
        assert roots["/teams/b"]["root"] == {"uid": 0, "gid": GROUP, "mode": "2770"}
        assert all(r["created"] and not r["differs"] and r["problem"] is None
                   for r in roots.values()), roots
        out = status_of(m)
        assert "namespace /proj-a:" in out
        assert "root uid 4201 gid 0 mode 0700, made by ckptfs" in out, out
        # A remount makes nothing again, and still says that ckptfs made them.
        m.stop()
        made_lines = m.log.count("namespace root /proj-a made")
        m.start()
        assert m.log.count("namespace root /proj-a made") == made_lines == 1
        assert as_user(mp, OWNER, OWNER, ["os.listdir('proj-a/run')"]) == [0]
        assert status_roots(m)["/proj-a"]["created"] == roots["/proj-a"]["created"]


@needs_root
@pytest.mark.allow_log_warnings("namespace root /proj-a exists owned by uid 4242",
                                "namespace /proj-f: /proj-f exists and is not a directory")
def test_an_existing_root_of_other_owners_is_left_alone_and_reported(tmp_path: Path) -> None:
    base = Path(tempfile.mkdtemp(prefix="ckptfs-nsroot-"))
    try:
        with config_mount("", base) as m:  # no namespaces yet: anyone makes directories
            m.mountpoint.chmod(0o777)
            assert as_user(m.mountpoint, STRANGER, STRANGER, [
                "os.mkdir('proj-a', 0o755)", "open('proj-a/theirs', 'w').write('x')",
                "open('proj-f', 'w').write('a file where a root should be')",
            ]) == [0, 0, 0]
            os.mkdir(m.mountpoint / "proj-b", 0o755)  # the right owner: root's
        config = (f'[access]\nadmin_gids = [{ADMIN}]\n'
                  f'[[namespace]]\npath = "/proj-a"\nuids = [{OWNER}]\n'
                  '[[namespace]]\npath = "/proj-b"\nuids = [0]\n'
                  '[[namespace]]\npath = "/proj-f"\nuids = [0]\n')
        with config_mount(config, base) as m:
            mp = m.mountpoint
            assert owner_mode(mp / "proj-a") == (STRANGER, STRANGER, 0o755)  # left alone
            assert (mp / "proj-f").is_file()
            warnings = [ln for ln in m.log.splitlines() if " WARNING " in ln]
            assert len([w for w in warnings if "/proj-a" in w]) == 1, warnings
            assert "left as it is (namespace[0].owner" in m.log
            roots = status_roots(m)
            assert roots["/proj-a"]["root"] == {"uid": STRANGER, "gid": STRANGER, "mode": "0755"}
            assert roots["/proj-a"]["differs"] == ["uid", "gid", "mode"]
            assert roots["/proj-a"]["created"] is None
            assert "owned by uid 4242" in roots["/proj-a"]["problem"]
            # The right owner, another mode: kept, shown as differing, no warning.
            assert roots["/proj-b"]["root"] == {"uid": 0, "gid": 0, "mode": "0755"}
            assert roots["/proj-b"]["differs"] == ["mode"] and roots["/proj-b"]["problem"] is None
            assert roots["/proj-f"]["root"] is None
            assert "not a directory" in roots["/proj-f"]["problem"]
            out = status_of(m)
            assert ("root uid 4242 gid 4242 mode 0755, differs from the config (uid, gid, "
                    "mode: config uid 4201 gid 0 mode 0700)") in out, out
            assert "root missing (/proj-f exists and is not a directory)" in out
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize(("line", "key", "words"), [
    ('owner = "no-such-user-ckptfs"', "namespace[0].owner", "no user named"),
    ('group = "no-such-group-ckptfs"', "namespace[0].group", "no group named"),
    ("mode = 700", "namespace[0].mode", "octal mode as a string"),
    ('mode = "rwx"', "namespace[0].mode", "octal mode"),
    ("owner = 4242", "namespace[0].owner", "neither an owner of the namespace"),
])
def test_bad_root_keys_exit_2_naming_the_key(tmp_path: Path, line: str, key: str,
                                             words: str) -> None:
    cfg = tmp_path / "ckptfs.toml"
    cfg.write_text(f'[[namespace]]\npath = "/proj-a"\nuids = [{OWNER}]\n{line}\n')
    (tmp_path / "mnt").mkdir()
    res = run_cli("mount", str(tmp_path / "mnt"), "--state-dir", str(tmp_path / "state"),
                  "--local", str(tmp_path), "--config", str(cfg))
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert f"{key}:" in res.stderr and words in res.stderr, res.stderr
    assert not (tmp_path / "state" / "daemon.pid").exists()
