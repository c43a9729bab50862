"""DeepSpeed (CPU accelerator) through a ckptfs mount: save_checkpoint, node loss,
load_checkpoint through DeepSpeed's own `latest` file on the new node.

DeepSpeed is optional (not in the compat extra): skipped with the reason when missing.
"""

from __future__ import annotations

import pytest

from tests.compat.compatkit import Nodes, free_port, latest, ls, markers, run_worker

pytest.importorskip(
    "deepspeed", reason="deepspeed is not installed (optional: pip install deepspeed; CPU works)"
)


def test_deepspeed_save_checkpoint_and_load_latest_on_a_new_node(nodes: Nodes) -> None:
    ref = nodes.base / "ref"
    ref.mkdir()
    m = nodes.first()
    root = m.mountpoint / "ds"
    out = markers(run_worker("deepspeed_worker.py", "save", root, ref, str(free_port())).stdout)
    assert out["saved"] == "global_step2,global_step4,latest", out
    nodes.sync_durable(m.mountpoint, ["/ds/global_step2", "/ds/global_step4"])
    got = ls(root)
    assert got["/ds/global_step4"]["framework"] == "deepspeed" and got["/ds/global_step4"]["step"] == 4
    assert latest(root) == root / "global_step4"
    nodes.lose(m)

    nodes.second()
    assert (root / "latest").read_text().strip() == "global_step4"
    assert latest(root) == root / "global_step4"
    out = markers(run_worker("deepspeed_worker.py", "resume", root, ref, str(free_port())).stdout)
    assert out["loaded"] == "global_step4" and out["global_step"] == "5", out
