"""Megatron-style checkpoints (megatron-core dist_checkpointing + Megatron-LM's tracker
file) through a ckptfs mount: a save killed before the tracker update, node loss, resume
through the tracker on the new node.

megatron-core is optional (not in the compat extra): skipped with the reason when missing.
"""

from __future__ import annotations

import pytest

from tests.compat.compatkit import Nodes, free_port, latest, ls, markers, run_worker, wait_state

pytest.importorskip(
    "megatron.core", reason="megatron-core is not installed (optional: pip install megatron-core)"
)


def test_megatron_tracker_layout_killed_save_and_resume_on_a_new_node(nodes: Nodes) -> None:
    ref = nodes.base / "ref"
    ref.mkdir()
    m = nodes.with_partial_after().first()
    save = m.mountpoint / "mg"
    res = run_worker("megatron_worker.py", "save", save, ref, str(free_port()), expect_rc=-9)
    assert markers(res.stdout)["killed_before_tracker"] == "iter_0000006"
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "4"
    # iter_0000006 is complete on disk (its .metadata too), but Megatron never recorded it.
    assert (save / "iter_0000006" / ".metadata").exists()
    wait_state(save, "/mg/iter_0000006", "partial")
    nodes.sync_durable(save, ["/mg/iter_0000002", "/mg/iter_0000004"])
    c = ls(save)["/mg/iter_0000004"]
    assert c["framework"] == "megatron" and c["step"] == 4, c
    assert latest(save) == save / "iter_0000004"
    nodes.lose(m)

    nodes.second()
    assert ls(save)["/mg/iter_0000006"]["state"] == "partial"
    assert latest(save) == save / "iter_0000004"
    out = markers(run_worker("megatron_worker.py", "resume", save, ref, str(free_port())).stdout)
    assert out["tracker"] == "4" and out["resumed"] == "ok", out  # Megatron agrees
