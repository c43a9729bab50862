"""Orbax CheckpointManager (JAX on the CPU) through a ckptfs mount: async StandardSave with
max_to_keep rotation, node loss, latest_step() and StandardRestore on the new node.

JAX and Orbax are optional (not in the compat extra): skipped with the reason when missing.
"""

from __future__ import annotations

import pytest

from tests.compat.compatkit import Nodes, latest, ls, markers, run_worker

pytest.importorskip("jax", reason="jax is not installed (optional: pip install jax orbax-checkpoint)")
pytest.importorskip(
    "orbax.checkpoint", reason="orbax-checkpoint is not installed (optional: pip install orbax-checkpoint)"
)


def test_orbax_save_and_restore_latest_step_on_a_new_node(nodes: Nodes) -> None:
    ref = nodes.base / "ref"
    ref.mkdir()
    m = nodes.first()
    root = m.mountpoint / "orbax"
    out = markers(run_worker("orbax_worker.py", "save", root, ref).stdout)
    assert out["saved"] == "4", out  # step 2 was deleted by max_to_keep=1
    nodes.sync_durable(root, ["/orbax/4"])
    c = ls(root)["/orbax/4"]
    assert c["framework"] == "orbax" and c["step"] == 4, c
    assert latest(root) == root / "4"
    nodes.lose(m)

    nodes.second()
    assert latest(root) == root / "4"
    out = markers(run_worker("orbax_worker.py", "resume", root, ref).stdout)
    assert out["latest_step"] == "4" and out["resumed"] == "5", out
