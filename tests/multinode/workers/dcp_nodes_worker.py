"""torch.distributed.checkpoint across nodes: 2 ranks (gloo on 127.0.0.1) save ONE
checkpoint, each through the mount of its own node; a world size of 1 loads it.

    dcp_nodes_worker.py save CKPT_A CKPT_B REF PORT
        CKPT_A and CKPT_B are the same checkpoint directory seen through node a's and node
        b's mounts. Rank 0 saves through CKPT_A (its data file and, as coordinator,
        .metadata), rank 1 through CKPT_B (its data file). The state: a weight sharded by
        rows over the 2 ranks (a DTensor: each rank writes only its half), a tensor of each
        rank's own, a replicated step counter. The full tensors go to REF (off the mounts).
    dcp_nodes_worker.py load CKPT REF
        One process, no process group (DCP plans the load for a world size of 1): loads the
        full weight (both ranks' shards) and every other tensor, bit-identical to REF.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard

from tests.compat.workers.compatstate import assert_identical, mark

WORLD = 2
ROWS, COLS = 1024, 640  # 2.5 MiB of float32: each rank's half spans several chunks
EXTRA = 300_001  # a rank's own tensor: not a whole number of chunks


def full_state() -> dict[str, torch.Tensor]:
    """What the save writes, as whole tensors (the same in every process)."""
    g = torch.Generator().manual_seed(1234)
    state = {"weight": torch.randn(ROWS, COLS, generator=g), "step": torch.tensor(7)}
    for r in range(WORLD):
        state[f"rank{r}.extra"] = torch.randn(EXTRA, generator=g)
    return state


def save_rank(rank: int, ckpts: list[str], port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        mesh = init_device_mesh("cpu", (WORLD,))
        full = full_state()
        half = ROWS // WORLD
        local = full["weight"][rank * half:(rank + 1) * half].clone()
        sd: dict[str, Any] = {
            "weight": DTensor.from_local(local, mesh, [Shard(0)], run_check=False),
            f"rank{rank}.extra": full[f"rank{rank}.extra"],
            "step": full["step"],
        }
        dcp.save(sd, checkpoint_id=ckpts[rank])
        dist.barrier()
        if rank == 0:
            mark("saved", ",".join(sorted(os.listdir(ckpts[0]))))
    finally:
        dist.destroy_process_group()


def load(ckpt: Path, ref: Path) -> None:
    want = torch.load(ref / "dcp-nodes.pt", weights_only=True)
    sd = {k: torch.zeros_like(v) for k, v in want.items()}
    dcp.load(sd, checkpoint_id=ckpt)  # no process group: a world size of 1
    assert_identical(sd, want, "loaded on node c")
    mark("loaded", ",".join(sorted(sd)))


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1] == "save":
        ckpt_a, ckpt_b, ref, port = sys.argv[2:6]
        torch.save(full_state(), Path(ref) / "dcp-nodes.pt")
        mp.spawn(save_rank, args=([ckpt_a, ckpt_b], port), nprocs=WORLD, join=True)
    else:
        load(Path(sys.argv[2]), Path(sys.argv[3]))
