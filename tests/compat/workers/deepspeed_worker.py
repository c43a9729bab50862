"""DeepSpeed (CPU accelerator, gloo, one process), unmodified engine.save_checkpoint and
engine.load_checkpoint.

    deepspeed_worker.py save DIR REF PORT
        4 steps, save_checkpoint at steps 2 and 4 (DIR/global_step2, DIR/global_step4 and
        DIR/latest naming the newest); in-memory copies at each save, and the model after
        step 5, go to REF.
    deepspeed_worker.py resume DIR REF PORT
        load_checkpoint(DIR): DeepSpeed's own choice through DIR/latest; checks model,
        optimizer and RNG bit-identical, and step 5 equal to the first run's.

DeepSpeed saves no RNG state of its own: it travels in client_state.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import deepspeed.ops  # noqa: E402
import torch  # noqa: E402

from tests.compat.workers.compatstate import (  # noqa: E402
    assert_identical,
    mark,
    rng_states,
    set_rng_states,
    snapshot,
)

CONFIG = {
    "train_batch_size": 4,
    "train_micro_batch_size_per_gpu": 4,
    "zero_optimization": {"stage": 0},
    "zero_allow_untested_optimizer": True,
    "steps_per_print": 1000,
}


# DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce op (about 45 s with a C++
# compiler, and none may be there): off. Communication goes through plain gloo instead.
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def engine(seed: int, port: str) -> Any:
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=port)
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                torch.nn.Dropout(0.1), torch.nn.Linear(1024, 256))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    eng, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=CONFIG)
    torch.manual_seed(100)
    return eng


def step(eng: Any) -> None:
    x = torch.randn(4, 256)
    loss = torch.nn.functional.mse_loss(eng(x), x)
    eng.backward(loss)
    eng.step()


def state_of(eng: Any) -> dict[str, Any]:
    return {"model": snapshot(eng.module.state_dict()),
            "optimizer": snapshot(eng.optimizer.state_dict()), "rng": snapshot(rng_states())}


def save(root: Path, ref: Path, port: str) -> None:
    mark("deepspeed", deepspeed.__version__)
    eng = engine(0, port)
    for n in range(1, 6):
        step(eng)
        if n in (2, 4):
            torch.save(state_of(eng), ref / f"ds-step-{n}.pt")
            eng.save_checkpoint(str(root), client_state={"rng": rng_states()})
    torch.save(snapshot(eng.module.state_dict()), ref / "ds-step-5-model.pt")
    mark("saved", ",".join(sorted(os.listdir(root))))


def resume(root: Path, ref: Path, port: str) -> None:
    eng = engine(1, port)
    path, client = eng.load_checkpoint(str(root))
    set_rng_states(client["rng"])
    mark("loaded", Path(path).parent.name)
    n = eng.global_steps
    assert_identical(state_of(eng), torch.load(ref / f"ds-step-{n}.pt", weights_only=False),
                     "restored")
    step(eng)
    assert_identical(eng.module.state_dict(), torch.load(ref / "ds-step-5-model.pt"), "step 5")
    mark("global_step", eng.global_steps)


if __name__ == "__main__":
    torch.set_num_threads(1)
    phase, root, ref, port = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    (save if phase == "save" else resume)(root, ref, port)
