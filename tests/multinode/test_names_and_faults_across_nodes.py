"""Issue 33 item 3 on a shared catalog (PostgreSQL): a checkpoint under names that are not
UTF-8, saved through node a, is seen committed by node b with the same bytes; an unexpected
error in node a's session heartbeat and tracker is contained (restarted, shown degraded by
`ckptfs status`) and both nodes keep serving."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.mount.test_checkpoints import hf_save
from tests.multinode.conftest import Cluster
from tests.support.mountutil import pid_alive, run_cli, wait_until

FAULTS = ("session", "tracker")


def roots(path: Path) -> dict[bytes, str]:
    res = run_cli("ls", str(path), "--json", timeout=60)
    assert res.returncode == 0, res.stderr
    return {os.fsencode(c["root"]): c["state"] for c in json.loads(res.stdout)}


@pytest.mark.allow_log_errors  # the injected faults are logged as ERROR with a traceback
def test_names_that_are_not_utf8_and_contained_faults_on_a_shared_catalog(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPTFS_TEST_FAULTS", ",".join(FAULTS))
    a = cluster.node("a")
    monkeypatch.delenv("CKPTFS_TEST_FAULTS")
    b = cluster.node("b")
    run_a = Path(os.fsdecode(os.fsencode(a.mountpoint) + b"/run-\xff"))
    run_b = Path(os.fsdecode(os.fsencode(b.mountpoint) + b"/run-\xff"))
    hf_save(run_a, 1, os.urandom(1 << 20))
    want = {b"/run-\xff/checkpoint-1": "committed"}
    wait_until(lambda: roots(run_b) == want, 20, "b sees a's checkpoint committed")
    os.rename(run_b, Path(os.fsdecode(os.fsencode(b.mountpoint) + b"/run-\xfe")))  # on b
    wait_until(lambda: roots(a.mountpoint) == {b"/run-\xfe/checkpoint-1": "committed"}, 20,
               "the rename on b moves the row a sees")

    def shown() -> dict[str, dict[str, object]] | None:
        res = run_cli("status", str(a.mountpoint), "--json", timeout=60)
        assert res.returncode == 0, res.stderr
        got = {x["name"]: x for x in json.loads(res.stdout)["services"]}
        return got if set(FAULTS) <= set(got) else None

    got = wait_until(shown, what="a's faults in its status")
    for name in FAULTS:
        assert got[name]["state"] == "degraded" and got[name]["errors"] == 1, got
    assert a.pid is not None and pid_alive(a.pid) and b.pid is not None and pid_alive(b.pid)
