"""The governance events in the audit log, on real mounts (docs/governance.md "Audit
log"): an admin's crossing into a namespace it does not own, a write refused by a quota,
a stranger's refused attempts (aggregated per operation and window), and the key changes
(the daemon creating a namespace key, `ckptfs rekey`, `ckptfs shred`), each with who did
it; the chain stays intact (`ckptfs audit verify`)."""

from __future__ import annotations

import errno
import os
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CkptFactory
from tests.mount.test_audit import export
from tests.mount.test_namespaces import OWNER as NS_OWNER
from tests.mount.test_namespaces import REACH_A, STRANGER, made, ns_mounted
from tests.mount.test_posix_perms import CHILD_PYTHON, as_user, needs_root
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


@pytest.mark.allow_log_warnings("admin override", "access refused")
def test_admin_crossing_and_quota_refusal_are_recorded_with_who(
    ckpt_factory: CkptFactory, tmp_path: Path,
) -> None:
    cfg = tmp_path / "ckptfs.toml"
    cfg.write_text(f'[access]\nadmin_gids = [{ADMIN_GID}]\n'
                   f'[[namespace]]\npath = "/proj"\nuids = [{OWNER}]\nquota = "1MiB"\n')
    m = ckpt_factory.mount(extra_args=("--config", str(cfg)))
    _, out = child(OWNER, """
import errno, os
os.chmod('proj', 0o777)  # made at mount, its owner's
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


def refused_by(m_state: Path, uid: int) -> list[dict[str, Any]]:
    return [r for r in records(m_state, "access_refused") if r["uid"] == uid]


@pytest.mark.allow_log_warnings("access refused")
def test_a_strangers_refused_attempts_are_audited_once_per_operation_and_window() -> None:
    # One window for the whole test: the unmount closes it.
    with ns_mounted("[audit]\nrefusal_window = 86400\n") as m:
        mp = m.mountpoint
        made(mp)  # the stranger's mkdir of each namespace root is refused first
        tries = REACH_A * 3  # 42 attempts into /proj-a, each refused by the daemon
        assert as_user(mp, STRANGER, STRANGER, tries) == [errno.EACCES] * len(tries)
        assert as_user(mp, NS_OWNER, NS_OWNER, REACH_A) == [0] * len(REACH_A)  # not refused
        m.stop()
        mine = refused_by(m.state_dir, STRANGER)
        keys = Counter((r["detail"]["namespace"], r["detail"]["op"]) for r in mine)
        assert keys and max(keys.values()) == 1, keys  # one record per namespace and op
        assert {("/proj-a", "mkdir"), ("/proj-b", "mkdir"), ("/proj-a", "lookup")} <= set(keys)
        assert all(r["path"] == r["detail"]["namespace"] and r["detail"]["count"] >= 1
                   and r["detail"]["first_ns"] <= r["detail"]["last_ns"] for r in mine), mine
        in_a = sum(r["detail"]["count"] for r in mine if r["detail"]["namespace"] == "/proj-a")
        assert in_a >= 1 + len(tries), mine  # the mkdir and every attempt, counted
        assert not refused_by(m.state_dir, NS_OWNER)
        # One WARNING line per record, naming who, what and where.
        lines = [ln for ln in m.log.splitlines() if f"access refused: uid {STRANGER}," in ln]
        assert len(lines) == len(mine), lines
        assert any("lookup in namespace /proj-a" in ln for ln in lines), lines
        res = run_cli("audit", "verify", "--state-dir", str(m.state_dir))
        assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.allow_log_warnings("access refused")
def test_a_window_of_refusals_is_recorded_when_it_ends_while_mounted() -> None:
    with ns_mounted("[audit]\nrefusal_window = 0.5\n") as m:
        mp = m.mountpoint
        made(mp)
        assert as_user(mp, STRANGER, STRANGER, ["os.listdir('proj-a')"] * 5) == [errno.EACCES] * 5
        wait_until(lambda: sum(r["detail"]["count"] for r in refused_by(m.state_dir, STRANGER)
                               if r["detail"]["namespace"] == "/proj-a") >= 6,
                   10, "the windows' records written while mounted")
        tail = run_cli("audit", "tail", "--state-dir", str(m.state_dir))
        assert tail.returncode == 0 and "access_refused" in tail.stdout, tail.stdout
