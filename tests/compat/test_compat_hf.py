"""Hugging Face Trainer (tiny GPT-2 from a config) through a ckptfs mount: save_total_limit
rotation, a save killed halfway, node loss, resume_from_checkpoint on the new node."""

from __future__ import annotations

import pytest

from tests.compat.compatkit import Nodes, latest, ls, markers, run_worker, wait_state

pytest.importorskip("transformers", reason="transformers is in the compat extra")
pytest.importorskip("accelerate", reason="accelerate is in the compat extra (Trainer needs it)")


def test_hf_trainer_rotation_killed_save_and_resume_on_a_new_node(nodes: Nodes) -> None:
    ref = nodes.base / "ref"
    ref.mkdir()
    m = nodes.with_partial_after().first()
    out = m.mountpoint / "job" / "out"
    res = run_worker("hf_worker.py", "train", out, ref, expect_rc=-9)
    got = markers(res.stdout)
    assert got["after_first_run"] == "checkpoint-4", got  # checkpoint-2 was rotated away
    assert got["killing_in"] == str(out / "checkpoint-6"), got
    wait_state(out, "/job/out/checkpoint-6", "partial")
    nodes.sync_durable(out, ["/job/out/checkpoint-4"])
    c = ls(out)["/job/out/checkpoint-4"]
    assert c["framework"] == "hf" and c["step"] == 4 and c["files"] == 8, c
    # HF's rotation removed checkpoint-2. ckptfs keeps its row, still "committed", with no
    # files (a ckptfs bug reported with this suite); `ckptfs latest` never picks it.
    gone = ls(out).get("/job/out/checkpoint-2")
    assert gone is None or (gone["files"] == 0 and gone["state"] in ("committed", "deleted")), gone
    assert not (out / "checkpoint-2").exists()
    assert latest(out) == out / "checkpoint-4"
    nodes.lose(m)

    nodes.second()
    assert ls(out)["/job/out/checkpoint-6"]["state"] == "partial"
    picked = latest(out)
    assert picked is not None and picked == out / "checkpoint-4"
    got = markers(run_worker("hf_worker.py", "resume", out, ref, picked).stdout)
    # HF's own rule (the highest checkpoint-N directory) would take the killed save, and
    # resume_from_checkpoint=True then fails: its trainer_state.json was never written.
    assert got["hf_get_last_checkpoint"] == str(out / "checkpoint-6"), got
    assert got["hf_resume_true"] == "FileNotFoundError: trainer_state.json", got
    assert got["global_step"] == "6", got
    # Training went on: checkpoint-6 was written again, complete, and rotation removed 4.
    assert got["after_resume"] == "checkpoint-6", got
    wait_state(out, "/job/out/checkpoint-6", "committed")
    assert latest(out) == out / "checkpoint-6"
