"""torch.distributed.checkpoint with 2 processes (gloo on 127.0.0.1), unmodified.

    dcp_worker.py save RUN REF PORT
        DDP training; dcp.save at step 2 (RUN/step-2), dcp.async_save at step 4
        (RUN/step-4, one training step runs while it writes), then a save at step 5
        (RUN/step-5) whose coordinator is SIGKILLed after every rank's .distcp file is
        written and before .metadata exists. In-memory copies of each rank's state at each
        save go to REF (not on the mount).
    dcp_worker.py resume RUN REF PORT
        Fresh model and optimizer; picks the checkpoint the way torchtitan does (the
        highest step-N holding .metadata), shows dcp.load refuses step-5, loads step-2 and
        the picked one, checks model, optimizer and RNG bit-identical to the copies, and
        trains one step that must equal the step the first run took after step 4.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.compat.workers.compatstate import assert_identical, mark, snapshot

WORLD = 2


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(512, 1024)  # 2 MiB: several chunks
        self.drop = torch.nn.Dropout(0.1)
        self.b = torch.nn.Linear(1024, 64)

    def forward(self, x: Any) -> Any:
        return self.b(self.drop(torch.relu(self.a(x))))


class KilledBeforeMetadata(dcp.FileSystemWriter):
    """The coordinator dies after every rank's data files are written, before .metadata."""

    def finish(self, metadata: Any, results: Any) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


def setup(rank: int, port: str, init_seed: int) -> tuple[Any, Any]:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(init_seed)  # the same on both ranks: a replicated (DDP) model
    model = DDP(Model())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(100 + rank)  # per-rank data and dropout stream
    return model, opt


def step(model: Any, opt: Any) -> None:
    x = torch.randn(8, 512)
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


def state(model: Any, opt: Any, rank: int, n: int) -> dict[str, Any]:
    msd, osd = get_state_dict(model, opt)
    # Plain tensors count as replicated (saved once); the RNG differs per rank: own key.
    return {"model": msd, "optim": osd, f"rng_rank{rank}": torch.get_rng_state(),
            "step": torch.tensor(n)}


def save(rank: int, run: Path, ref: Path, port: str) -> None:
    model, opt = setup(rank, port, 0)
    for _ in range(2):
        step(model, opt)
    sd = state(model, opt, rank, 2)
    torch.save(snapshot(sd), ref / f"dcp-step-2-rank{rank}.pt")
    dcp.save(sd, checkpoint_id=run / "step-2")
    for _ in range(2):
        step(model, opt)
    sd = state(model, opt, rank, 4)
    torch.save(snapshot(sd), ref / f"dcp-step-4-rank{rank}.pt")
    # The save's collectives run in a background thread while training goes on, so they
    # get a process group of their own (on the default one they can interleave with DDP's
    # all-reduce differently on each rank and deadlock: seen here with gloo).
    ckpt_group = dist.new_group(backend="gloo")
    future = dcp.async_save(sd, checkpoint_id=run / "step-4", process_group=ckpt_group)
    assert isinstance(future, Future)  # no stager given: a plain Future, no AsyncSaveResponse
    step(model, opt)  # training goes on while the checkpoint is written
    future.result()
    torch.save(snapshot(get_state_dict(model, opt)[0]), ref / f"dcp-step-5-rank{rank}.pt")
    dist.barrier()
    if rank == 0:
        mark("saved", "step-2,step-4")
    sd = state(model, opt, rank, 5)
    dcp.save(sd, storage_writer=KilledBeforeMetadata(run / "step-5"))
    raise AssertionError("the save at step 5 should have been killed")


def framework_latest(run: Path) -> Path | None:
    """torchtitan's rule: the highest step-N directory that holds .metadata."""
    steps = [(int(m.group(1)), p) for p in run.iterdir()
             if (m := re.fullmatch(r"step-(\d+)", p.name)) and (p / ".metadata").is_file()]
    return max(steps)[1] if steps else None


def resume(rank: int, run: Path, ref: Path, port: str) -> None:
    model, opt = setup(rank, port, 1)  # a different init: the load must overwrite it
    picked = framework_latest(run)
    assert picked is not None
    try:
        dcp.load(state(model, opt, rank, 0), checkpoint_id=run / "step-5")
    except (Exception, CheckpointException) as exc:  # any refusal will do; report it
        # CheckpointException derives from BaseException: `except Exception` misses it.
        if rank == 0:
            mark("partial_load", f"refused: {type(exc).__name__}")
    else:
        raise AssertionError("dcp.load accepted step-5, which has no .metadata")
    for ckpt in ("step-2", picked.name):
        sd = state(model, opt, rank, 0)
        dcp.load(sd, checkpoint_id=run / ckpt)
        set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        torch.set_rng_state(sd[f"rng_rank{rank}"])
        want = torch.load(ref / f"dcp-{ckpt}-rank{rank}.pt", weights_only=True)
        assert_identical(state(model, opt, rank, int(sd["step"])), want, f"rank {rank} {ckpt}")
    step(model, opt)
    want = torch.load(ref / f"dcp-step-5-rank{rank}.pt", weights_only=True)
    assert_identical(get_state_dict(model, opt)[0], want, f"rank {rank} one more step")
    dist.barrier()
    if rank == 0:
        mark("framework_latest", picked)
        mark("resumed", "ok")


def main(rank: int, phase: str, run: str, ref: str, port: str) -> None:
    torch.set_num_threads(1)
    try:
        (save if phase == "save" else resume)(rank, Path(run), Path(ref), port)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    phase, run, ref, port = sys.argv[1:5]
    if phase == "save":
        try:
            mp.spawn(main, args=(phase, run, ref, port), nprocs=WORLD, join=True)
        except mp.ProcessExitedException as exc:
            mark("killed", f"rank {exc.error_index} {exc.signal_name or exc.exit_code}")
        except mp.ProcessRaisedException as exc:  # the survivor may notice first
            mark("killed", f"rank {exc.error_index} raised")
        files = sorted(p.name for p in Path(run, "step-5").iterdir())
        mark("step5_files", ",".join(files))
    else:
        mp.spawn(main, args=(phase, run, ref, port), nprocs=WORLD, join=True)
