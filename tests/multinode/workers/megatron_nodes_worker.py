"""megatron-core dist_checkpointing across nodes: 2 ranks (gloo on 127.0.0.1) save ONE
checkpoint (torch_dist format), each through the mount of its own node; a world size of 1
loads it (Megatron's resharding load).

    megatron_nodes_worker.py save CKPT_A CKPT_B REF PORT
        CKPT_A and CKPT_B: the same (existing, empty) checkpoint directory seen through
        node a's and node b's mounts. Rank 0 saves through CKPT_A (its shards, and as
        coordinator .metadata, metadata.json and common.pt), rank 1 through CKPT_B. The
        state: two weights sharded by rows over the ranks (ShardedTensor, one half each),
        an object of each rank's own (ShardedObject), a common iteration number. The full
        state goes to REF (off the mounts).
    megatron_nodes_worker.py load CKPT REF PORT
        One process (world size 1): loads the full weights, both ranks' objects and the
        iteration; bit-identical to REF.

megatron-core calls torch.cuda.synchronize() and torch.cuda.current_device() on the save
path even for CPU tensors: both are shimmed (CPU-only torch has no CUDA), as in
tests/compat/workers/megatron_worker.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

torch.cuda.synchronize = lambda *a, **k: None
torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from megatron.core import dist_checkpointing  # noqa: E402
from megatron.core.dist_checkpointing import ShardedTensor  # noqa: E402
from megatron.core.dist_checkpointing.mapping import ShardedObject  # noqa: E402

from tests.compat.workers.compatstate import assert_identical, mark  # noqa: E402

WORLD = 2
SHAPES = {"decoder.weight": (1024, 512), "decoder.bias": (2048,)}  # 2 MiB and 8 KiB


def full_state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(4321)
    state: dict[str, Any] = {k: torch.randn(*s, generator=g) for k, s in SHAPES.items()}
    for r in range(WORLD):
        state[f"rank{r}.rng"] = {"seed": 100 + r, "state": torch.randn(1000, generator=g)}
    state["iteration"] = 12
    return state


def sharded(full: dict[str, Any], rank: int, world: int, template: bool) -> dict[str, Any]:
    """Megatron's shape of a checkpoint for ``rank`` of ``world``: tensors split by rows."""
    out: dict[str, Any] = {}
    for key in SHAPES:
        t = full[key]
        part = t.shape[0] // world
        local = t[rank * part:(rank + 1) * part].clone()
        if template:
            local = torch.zeros_like(local)
        offsets = [(0, rank, world)] if world > 1 else []
        out[key] = ShardedTensor.from_rank_offsets(key, local, *offsets)
    ranks = [rank] if world > 1 else list(range(WORLD))  # world 1 loads every rank's object
    for r in ranks:
        out[f"rank{r}.rng"] = ShardedObject(f"rank{r}.rng", None if template else full[f"rank{r}.rng"],
                                            (1,), (0,))
    out["iteration"] = None if template else full["iteration"]
    return out


def init(rank: int, world: int, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def save_rank(rank: int, ckpts: list[str], port: str) -> None:
    torch.set_num_threads(1)
    init(rank, WORLD, port)
    try:
        dist_checkpointing.save(sharded(full_state(), rank, WORLD, False), ckpts[rank])
        dist.barrier()
        if rank == 0:
            mark("saved", ",".join(sorted(os.listdir(ckpts[0]))))
    finally:
        dist.destroy_process_group()


def load(ckpt: Path, ref: Path, port: str) -> None:
    init(0, 1, port)
    try:
        want = torch.load(ref / "mg-nodes.pt", weights_only=False)
        got = dist_checkpointing.load(sharded(want, 0, 1, True), str(ckpt))
        assert_identical(got, want, "loaded on node c")
        mark("loaded", ",".join(sorted(got)))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1] == "save":
        ckpt_a, ckpt_b, ref, port = sys.argv[2:6]
        torch.save(full_state(), Path(ref) / "mg-nodes.pt")
        mp.spawn(save_rank, args=([ckpt_a, ckpt_b], port), nprocs=WORLD, join=True)
    else:
        load(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])
