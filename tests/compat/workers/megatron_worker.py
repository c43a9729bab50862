"""Megatron-style checkpoints with megatron-core's dist_checkpointing (torch_dist format),
one process on the CPU (gloo), and Megatron-LM's tracker layout:
``SAVE/iter_{N:07d}/`` plus ``SAVE/latest_checkpointed_iteration.txt``, rewritten by rank
0 after each save (megatron/training/checkpointing.py, which is not in megatron-core).

    megatron_worker.py save SAVE REF PORT
        5 steps; saves at iterations 2 and 4 (tracker updated after each), then a save at
        iteration 6 that is killed after its files and before the tracker update.
    megatron_worker.py resume SAVE REF PORT
        Megatron's own choice (the tracker), dist_checkpointing.load; model, optimizer and
        RNG bit-identical; one more step equal to the first run's step 5.

megatron-core calls torch.cuda.synchronize() and torch.cuda.current_device() on the save
path even for CPU tensors: both are shimmed here (CPU-only torch has no CUDA).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch

torch.cuda.synchronize = lambda *a, **k: None
torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]

import torch.distributed as dist  # noqa: E402
from megatron.core import dist_checkpointing  # noqa: E402
from megatron.core.dist_checkpointing import ShardedTensor  # noqa: E402
from megatron.core.dist_checkpointing.mapping import ShardedObject  # noqa: E402

from tests.compat.workers.compatstate import (  # noqa: E402
    assert_identical,
    mark,
    rng_states,
    set_rng_states,
    snapshot,
)

TRACKER = "latest_checkpointed_iteration.txt"


def setup(seed: int, port: str) -> tuple[Any, Any]:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                torch.nn.Dropout(0.1), torch.nn.Linear(1024, 256))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(100)
    return model, opt


def step(model: Any, opt: Any) -> None:
    x = torch.randn(8, 256)
    torch.nn.functional.mse_loss(model(x), x).backward()
    opt.step()
    opt.zero_grad()


def sharded(model: Any, opt: Any, iteration: int | None, template: bool = False) -> dict[str, Any]:
    """Megatron's shape of a checkpoint: ShardedTensors for model and optimizer tensors
    (here each "shard" is the whole tensor, one rank), a ShardedObject per rank for the
    RNG state, and plain values (common.pt) for the rest."""
    names = [n for n, _ in model.named_parameters()]
    osd = opt.state_dict()

    def t(key: str, v: torch.Tensor) -> ShardedTensor:
        return ShardedTensor.from_rank_offsets(key, torch.zeros_like(v) if template else v)

    out: dict[str, Any] = {f"model.{n}": t(f"model.{n}", p) for n, p in model.state_dict().items()}
    for i, n in enumerate(names):
        for k in ("exp_avg", "exp_avg_sq"):
            out[f"optimizer.{n}.{k}"] = t(f"optimizer.{n}.{k}", osd["state"][i][k])
    out["optimizer.steps"] = None if template else {i: osd["state"][i]["step"] for i in osd["state"]}
    out["optimizer.param_groups"] = None if template else osd["param_groups"]
    out["rng_state"] = ShardedObject("rng_state", None if template else rng_states(), (1,), (0,))
    out["iteration"] = iteration
    return out


def restore(model: Any, opt: Any, got: dict[str, Any]) -> None:
    names = [n for n, _ in model.named_parameters()]
    model.load_state_dict({n: got[f"model.{n}"] for n in model.state_dict()})
    state = {i: {"step": got["optimizer.steps"][i],
                 **{k: got[f"optimizer.{n}.{k}"] for k in ("exp_avg", "exp_avg_sq")}}
             for i, n in enumerate(names)}
    opt.load_state_dict({"state": state, "param_groups": got["optimizer.param_groups"]})
    set_rng_states(got["rng_state"])


def state_of(model: Any, opt: Any) -> dict[str, Any]:
    return {"model": snapshot(model.state_dict()), "optimizer": snapshot(opt.state_dict()),
            "rng": snapshot(rng_states())}


def save_iteration(save: Path, model: Any, opt: Any, n: int) -> None:
    d = save / f"iter_{n:07d}"
    d.mkdir(parents=True)
    dist_checkpointing.save(sharded(model, opt, n), str(d))


def save(save: Path, ref: Path, port: str) -> None:
    import megatron.core

    mark("megatron_core", megatron.core.__version__)
    model, opt = setup(0, port)
    for n in range(1, 6):
        step(model, opt)
        if n in (2, 4):
            torch.save(state_of(model, opt), ref / f"mg-step-{n}.pt")
            save_iteration(save, model, opt, n)
            dist.barrier()
            (save / TRACKER).write_text(str(n))  # rank 0, after the barrier, like Megatron
    torch.save(snapshot(model.state_dict()), ref / "mg-step-5-model.pt")
    save_iteration(save, model, opt, 6)
    mark("killed_before_tracker", "iter_0000006")
    os.kill(os.getpid(), signal.SIGKILL)


def resume(save: Path, ref: Path, port: str) -> None:
    model, opt = setup(1, port)
    step(model, opt)  # optimizer state exists, so the template has every tensor
    n = int((save / TRACKER).read_text().strip())  # Megatron's choice: the tracker
    mark("tracker", n)
    got = dist_checkpointing.load(sharded(model, opt, None, template=True),
                                  str(save / f"iter_{n:07d}"))
    assert got["iteration"] == n
    restore(model, opt, got)
    assert_identical(state_of(model, opt), torch.load(ref / f"mg-step-{n}.pt", weights_only=False),
                     "restored")
    step(model, opt)
    assert_identical(model.state_dict(), torch.load(ref / "mg-step-5-model.pt"), "step 5")
    mark("resumed", "ok")


if __name__ == "__main__":
    torch.set_num_threads(1)
    phase, root, ref, port = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    try:
        (save if phase == "save" else resume)(root, ref, port)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
