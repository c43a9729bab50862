"""torch.save / torch.load (plain and mmap=True) and safetensors, unmodified, through a
ckptfs mount: save on node 1, lose node 1, restore on node 2 from the bucket, resume
bit-identical and train on. In-process: these libraries keep no global state."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from tests.compat.compatkit import Nodes, latest, ls
from tests.compat.workers.compatstate import assert_identical, snapshot

if TYPE_CHECKING:
    import torch
else:
    torch = pytest.importorskip("torch", reason="torch is part of the test extra")
safetensors_torch = pytest.importorskip("safetensors.torch", reason="safetensors is in the test extra")

VOCAB = 1000


@pytest.fixture(autouse=True)
def _keep_global_rngs() -> Iterator[None]:
    """These tests seed the pytest process's RNGs: leave them as they were."""
    saved = torch.get_rng_state(), random.getstate()
    yield
    torch.set_rng_state(saved[0])
    random.setstate(saved[1])


class Tiny(torch.nn.Module):
    """About 2.3 MiB of fp32 parameters, so each checkpoint spans several 1 MiB chunks."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 256)
        self.hidden = torch.nn.Linear(256, 256)
        self.drop = torch.nn.Dropout(0.1)  # draws from the torch RNG: its state matters
        self.out = torch.nn.Linear(256, VOCAB)

    def forward(self, x: Any) -> Any:
        return self.out(self.drop(torch.relu(self.hidden(self.embed(x)))))


def make(seed: int) -> tuple[Any, Any]:
    torch.manual_seed(seed)
    model = Tiny()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model: Any, opt: Any) -> float:
    """Batch and dropout mask come from the global RNGs, as in a real data pipeline."""
    x = torch.randint(0, VOCAB, (8, 16))
    y = (x + random.randrange(VOCAB)) % VOCAB
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
    return float(loss.detach())


def trained() -> tuple[Any, Any]:
    model, opt = make(0)
    random.seed(0)
    for _ in range(3):
        train_step(model, opt)
    return model, opt


def test_torch_save_then_load_and_mmap_load_on_a_new_node(nodes: Nodes) -> None:
    m = nodes.first()
    run = m.mountpoint / "run"
    run.mkdir()
    model, opt = trained()
    ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(),
            "rng": torch.get_rng_state(), "python_rng": random.getstate(), "step": 3}
    saved = snapshot(ckpt)
    torch.save(ckpt, run / "step-3.pt")
    train_step(model, opt)  # where an uninterrupted run goes next
    continued = snapshot(model.state_dict())
    nodes.sync_durable(run, ["/run/step-3.pt"])
    assert ls(run)["/run/step-3.pt"]["framework"] == "torch"
    nodes.lose(m)

    m = nodes.second()
    path = run / "step-3.pt"
    assert ls(run)["/run/step-3.pt"]["state"] == "committed"
    assert latest(run) == path
    for mmap in (False, True):
        model2, opt2 = make(1)  # a different init, overwritten by the load
        got = torch.load(path, mmap=mmap, weights_only=True)
        model2.load_state_dict(got["model"])
        opt2.load_state_dict(got["optimizer"])
        torch.set_rng_state(got["rng"])
        random.setstate(got["python_rng"])
        assert_identical(model2.state_dict(), saved["model"], f"model (mmap={mmap})")
        assert_identical(opt2.state_dict(), saved["optimizer"], f"optimizer (mmap={mmap})")
        assert_identical(torch.get_rng_state(), saved["rng"], "torch rng")
        assert random.getstate() == saved["python_rng"]
        assert got["step"] == 3
        train_step(model2, opt2)
        assert_identical(model2.state_dict(), continued, f"one more step (mmap={mmap})")
        del got


def _flat_optimizer(opt: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """An optimizer state as safetensors can hold it: tensors, plus JSON metadata."""
    sd = opt.state_dict()
    tensors = {f"state.{pid}.{k}": v for pid, st in sd["state"].items() for k, v in st.items()}
    return tensors, {"param_groups": json.dumps(sd["param_groups"])}


def _unflat_optimizer(tensors: dict[str, Any], meta: dict[str, str]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for key, t in tensors.items():
        _, pid, k = key.split(".", 2)
        state.setdefault(int(pid), {})[k] = t
    return {"state": state, "param_groups": json.loads(meta["param_groups"])}


def test_safetensors_save_then_load_on_a_new_node(nodes: Nodes) -> None:
    m = nodes.first()
    run = m.mountpoint / "run" / "step-3"
    run.mkdir(parents=True)
    model, opt = trained()
    saved = {"model": snapshot(model.state_dict()), "optimizer": snapshot(opt.state_dict()),
             "rng": torch.get_rng_state()}
    safetensors_torch.save_model(model, str(run / "model.safetensors"))
    tensors, meta = _flat_optimizer(opt)
    tensors["rng.torch"] = torch.get_rng_state()
    safetensors_torch.save_file(tensors, str(run / "optimizer.safetensors"), metadata=meta)
    python_rng = random.getstate()
    train_step(model, opt)
    continued = snapshot(model.state_dict())
    roots = ["/run/step-3/model.safetensors", "/run/step-3/optimizer.safetensors"]
    nodes.sync_durable(m.mountpoint / "run", roots)
    assert {ls(run)[r]["framework"] for r in roots} == {"safetensors"}
    nodes.lose(m)

    nodes.second()
    model2, opt2 = make(1)
    missing, unexpected = safetensors_torch.load_model(model2, str(run / "model.safetensors"))
    assert not missing and not unexpected
    got = safetensors_torch.load_file(str(run / "optimizer.safetensors"))  # mmap-based
    with safetensors_torch.safe_open(str(run / "optimizer.safetensors"), "pt") as f:
        meta2 = f.metadata()
    torch.set_rng_state(got.pop("rng.torch"))
    opt2.load_state_dict(_unflat_optimizer(got, meta2))
    random.setstate(python_rng)
    assert_identical(model2.state_dict(), saved["model"], "model")
    assert_identical(opt2.state_dict(), saved["optimizer"], "optimizer")
    assert_identical(torch.get_rng_state(), saved["rng"], "torch rng")
    train_step(model2, opt2)
    assert_identical(model2.state_dict(), continued, "one more step")
