"""The governance events in the audit log, on real mounts (docs/governance.md "Audit
log"): an admin's crossing into a namespace it does not own, a write refused by a quota,
and the key changes (the daemon creating a namespace key, `ckptfs rekey`, `ckptfs shred`),
each with who did it; the chain stays intact (`ckptfs audit verify`)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CkptFactory
from tests.mount.test_audit import export
from tests.mount.test_posix_perms import CHILD_PYTHON, needs_root
from tests.support import encryption as enc
from tests.support.mountutil import run_cli, wait_until

pytestmark = needs_root

OWNER, ADMIN_GID = 4242, 4343


def child(uid: int, code: str, cwd: Path, extra_groups: tuple[int, ...] = ()) -> tuple[int, str]:
    """Run ``code`` as ``uid`` (gid = uid, plus ``extra_groups``) in ``cwd`` (entered before
    the uid changes: the test's tmp dir is root's only); (exit code, stdout)."""
    res = subprocess.run([CHILD_PYTHON, "-c", code], user=uid, group=uid,
                         extra_groups=list(extra_groups), cwd=cwd, capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    return res.returncode, res.stdout


def records(m_state: Path, action: str) -> list[dict[str, Any]]:
    return [r for r in export(str(m_state)) if r["action"] == action]


@pytest.mark.allow_log_warnings("admin override")
def test_admin_crossing_and_quota_refusal_are_recorded_with_who(
    ckpt_factory: CkptFactory, tmp_path: Path,
) -> None:
    cfg = tmp_path / "ckptfs.toml"
    cfg.write_text(f'[access]\nadmin_gids = [{ADMIN_GID}]\n'
                   f'[[namespace]]\npath = "/proj"\nuids = [{OWNER}]\nquota = "1MiB"\n')
    m = ckpt_factory.mount(extra_args=("--config", str(cfg)))
    os.chmod(m.mountpoint, 0o777)  # the owner creates its namespace's root itself
    _, out = child(OWNER, """
import errno, os
os.mkdir('proj', 0o777)
try:
    with open('proj/big.bin', "wb") as f:
        f.write(os.urandom(2 * 1024 * 1024))
    print("written")
except OSError as exc:
    print(errno.errorcode[exc.errno], os.getpid())
""", m.mountpoint)
    words = out.split()
    assert words[0] == "EDQUOT", out
    owner_pid = int(words[1])
    # Root (uid 0, no admin gid) is refused; with the admin gid it may read, and is recorded.
    _, out = child(0, """
import os
try:
    os.listdir('proj'); print("listed")
except PermissionError:
    print("EACCES")
""", m.mountpoint)
    assert out.strip() == "EACCES"
    _, out = child(0, "import os\nprint(sorted(os.listdir('proj')), os.getpid())",
                   m.mountpoint, extra_groups=(ADMIN_GID,))
    admin_pid = int(out.split()[-1])

    def both() -> bool:
        return bool(records(m.state_dir, "admin_override")) and bool(
            records(m.state_dir, "quota_refused"))

    wait_until(both, 10, "the noted records are written")
    refusals = records(m.state_dir, "quota_refused")
    assert {(r["uid"], r["pid"], r["path"]) for r in refusals} >= {
        (OWNER, owner_pid, "/proj/big.bin")}, refusals
    overrides = records(m.state_dir, "admin_override")
    assert overrides and all(r["uid"] == 0 and r["pid"] == admin_pid for r in overrides), overrides
    assert {r["detail"]["namespace"] for r in overrides} == {"/proj"}
    res = run_cli("audit", "verify", "--state-dir", str(m.state_dir))
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.allow_log_warnings("could not reload the namespace keys")
def test_key_creation_rotation_and_shred_are_recorded(
    ckpt_factory: CkptFactory, tmp_path: Path,
) -> None:
    kek_path, _ = enc.kek_file(tmp_path / "keys" / "kek")
    cfg = enc.config(tmp_path / "ckptfs.toml", kek_path, encrypted=("/proj-a",), plain=())
    m = ckpt_factory.mount(extra_args=("--chunk-size", "1MiB", "--config", str(cfg)))
    created = records(m.state_dir, "key_create")
    assert [(r["path"], r["uid"], r["detail"]["version"]) for r in created] == [
        ("/proj-a", 0, 1)], created
    res = run_cli("rekey", "--config", str(cfg), "--state-dir", str(m.state_dir),
                  "--namespace", "/proj-a")
    assert res.returncode == 0, res.stderr
    res = run_cli("shred", "/proj-a", "--config", str(cfg), "--state-dir", str(m.state_dir),
                  "--yes")
    assert res.returncode == 0, res.stderr
    rotated = records(m.state_dir, "key_rotate")
    assert [(r["path"], r["uid"], r["detail"]["version"]) for r in rotated] == [
        ("/proj-a", os.getuid(), 2)], rotated
    shreds = records(m.state_dir, "shred")
    assert [(r["path"], r["uid"]) for r in shreds] == [("/proj-a", os.getuid())], shreds
    assert len(shreds[0]["detail"]["key_ids"]) == 2
    res = run_cli("audit", "verify", "--state-dir", str(m.state_dir))
    assert res.returncode == 0, res.stdout + res.stderr
