"""Real frameworks across nodes: one checkpoint written by 2 ranks, each through the mount
of its own node (the same directory in the shared namespace), made durable with `ckptfs
sync` on both nodes, and loaded with another world size (1) on a third, new node: empty
state dir and local tiers, the same catalog and bucket, so every chunk comes from the
bucket. The frameworks run unmodified in worker interpreters (tests/multinode/workers;
tests/compat/compatkit.py runs them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.compat.compatkit import free_port, markers, run_worker
from tests.multinode.conftest import Cluster, sync
from tests.support.mountutil import Mount, run_cli, wait_until

pytestmark = [pytest.mark.usefixtures("postgres"), pytest.mark.slow]

WORKERS = "tests.multinode.workers"



def local_chunks(node: Mount) -> int:
    """The chunks the node's own local tiers hold (the shared catalog's status)."""
    res = run_cli("status", "--state-dir", str(node.state_dir), "--json", timeout=60)
    assert res.returncode == 0, res.stderr
    name = node.state_dir.parent.name
    tiers = json.loads(res.stdout)["tiers"]
    return sum(t["stored_chunks"] for t in tiers if t["name"].startswith(f"{name}:"))


def two_ranks_two_nodes(cluster: Cluster, rel: str) -> tuple[Mount, Mount, Path, Path]:
    """Nodes a and b, the checkpoint's parent made on a and seen on b."""
    a, b = cluster.node("a"), cluster.node("b")
    parent = Path(rel).parent
    (a.mountpoint / parent).mkdir(parents=True)
    wait_until(lambda: (b.mountpoint / parent).is_dir(), 5, "b sees the run directory")
    return a, b, a.mountpoint / rel, b.mountpoint / rel


def sync_both(a: Mount, b: Mount, ckpt_a: Path, ckpt_b: Path) -> None:
    sync(a, ckpt_a)
    sync(b, ckpt_b)


def test_dcp_two_ranks_on_two_nodes_load_on_a_third_with_world_size_one(
    cluster: Cluster, tmp_path: Path
) -> None:
    pytest.importorskip("torch.distributed.checkpoint")
    ref = tmp_path / "ref"
    ref.mkdir()
    a, b, ckpt_a, ckpt_b = two_ranks_two_nodes(cluster, "run/step-1")
    out = markers(run_worker("dcp_nodes_worker.py", "save", ckpt_a, ckpt_b, ref,
                             str(free_port()), package=WORKERS).stdout)
    # One directory: rank 0's and rank 1's data files and the coordinator's .metadata.
    assert out["saved"] == ".metadata,__0_0.distcp,__1_0.distcp", out
    assert sorted(p.name for p in ckpt_b.iterdir()) == out["saved"].split(",")
    # Each rank's file went through its own node: both nodes' local tiers hold chunks.
    assert local_chunks(a) > 0 and local_chunks(b) > 0
    sync_both(a, b, ckpt_a, ckpt_b)

    c = cluster.node("c")  # empty state dir and tiers: reads come from the bucket
    assert local_chunks(c) == 0
    out = markers(run_worker("dcp_nodes_worker.py", "load", c.mountpoint / "run" / "step-1", ref,
                             package=WORKERS).stdout)
    assert out["loaded"] == "rank0.extra,rank1.extra,step,weight", out


def test_megatron_dist_checkpointing_two_ranks_on_two_nodes_reshard_to_one_on_a_third(
    cluster: Cluster, tmp_path: Path
) -> None:
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (optional)")
    ref = tmp_path / "ref"
    ref.mkdir()
    a, b, ckpt_a, ckpt_b = two_ranks_two_nodes(cluster, "mg/iter_0000012")
    ckpt_a.mkdir()  # Megatron saves into an existing, empty directory
    wait_until(ckpt_b.is_dir, 5, "b sees the checkpoint directory")
    out = markers(run_worker("megatron_nodes_worker.py", "save", ckpt_a, ckpt_b, ref,
                             str(free_port()), package=WORKERS).stdout)
    saved = out["saved"].split(",")
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "common.pt", "metadata.json"} <= set(saved), saved
    assert sorted(p.name for p in ckpt_b.iterdir()) == saved
    assert local_chunks(a) > 0 and local_chunks(b) > 0
    sync_both(a, b, ckpt_a, ckpt_b)

    c = cluster.node("c")
    assert local_chunks(c) == 0
    out = markers(run_worker("megatron_nodes_worker.py", "load", c.mountpoint / "mg" / "iter_0000012",
                             ref, str(free_port()), package=WORKERS).stdout)
    assert out["loaded"] == "decoder.bias,decoder.weight,iteration,rank0.rng,rank1.rng", out
