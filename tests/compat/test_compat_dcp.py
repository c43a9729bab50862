"""torch.distributed.checkpoint, 2 processes (gloo): dcp.save and dcp.async_save through a
ckptfs mount, a save killed before its .metadata, node loss, restore, resume."""

from __future__ import annotations

import pytest

from tests.compat.compatkit import (
    Nodes,
    free_port,
    latest,
    ls,
    markers,
    run_worker,
    wait_state,
)

pytest.importorskip("torch.distributed.checkpoint", reason="torch is part of the test extra")


def test_dcp_save_and_async_save_two_ranks_restore_bit_identical(nodes: Nodes) -> None:
    ref = nodes.base / "ref"
    ref.mkdir()
    m = nodes.with_partial_after().first()
    run = m.mountpoint / "run"
    run.mkdir()
    out = markers(run_worker("dcp_worker.py", "save", run, ref, str(free_port())).stdout)
    assert out.get("saved") == "step-2,step-4", out
    assert "killed" in out, out
    # Both ranks' data files are there, .metadata never came.
    step5 = out["step5_files"].split(",")
    assert {"__0_0.distcp", "__1_0.distcp"} <= set(step5) and ".metadata" not in step5, step5
    wait_state(run, "/run/step-5", "partial")
    nodes.sync_durable(run, ["/run/step-2", "/run/step-4"])
    got = ls(run)
    assert {got[r]["framework"] for r in ("/run/step-2", "/run/step-4")} == {"dcp"}
    assert got["/run/step-2"]["files"] >= 3 and got["/run/step-4"]["files"] >= 3
    assert latest(run) == run / "step-4"
    nodes.lose(m)

    m = nodes.second()
    assert ls(run)["/run/step-4"]["state"] == "committed"
    assert ls(run)["/run/step-5"]["state"] == "partial"
    assert latest(run) == run / "step-4"
    out = markers(run_worker("dcp_worker.py", "resume", run, ref, str(free_port())).stdout)
    assert out.get("resumed") == "ok", out
    assert out["partial_load"].startswith("refused"), out
    # ckptfs latest and the framework-side rule (.metadata present, highest step) agree.
    assert out["framework_latest"] == str(run / "step-4"), out
