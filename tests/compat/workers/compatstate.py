"""Shared by the framework workers (and the in-process tests): bit-exact comparison of
nested states, RNG snapshots, and ``@@KEY=VALUE`` markers for the test to read.

The workers run in their own interpreter (tests/compat/compatkit.py ``run_worker``), as
modules of tests.compat.workers (the repository on PYTHONPATH).
"""

from __future__ import annotations

import copy
import random
from typing import Any

import numpy as np
import torch


def mark(key: str, value: object) -> None:
    print(f"@@{key}={value}", flush=True)


def snapshot(obj: Any) -> Any:
    """A deep copy, detached from the live model/optimizer (the in-memory reference)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: snapshot(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(snapshot(v) for v in obj)
    return copy.deepcopy(obj)


def rng_states() -> dict[str, Any]:
    """The global RNG states, in types ``torch.load(weights_only=True)`` accepts."""
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "torch": torch.get_rng_state(),
        "numpy": (name, torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(pos),
                  int(has_gauss), float(cached)),
        "python": random.getstate(),
    }


def set_rng_states(rng: dict[str, Any]) -> None:
    torch.set_rng_state(rng["torch"])
    name, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(rng["python"])


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().reshape(-1).contiguous()
    return t.view(torch.uint8) if t.numel() and t.dtype != torch.bool else t


def assert_identical(got: Any, want: Any, where: str = "state") -> None:
    """Equal structure, dtypes, shapes and bytes (so -0.0 != 0.0 and NaN payloads count)."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{where}: {type(got)} is not a tensor"
        assert got.dtype == want.dtype, f"{where}: dtype {got.dtype} != {want.dtype}"
        assert got.shape == want.shape, f"{where}: shape {tuple(got.shape)} != {tuple(want.shape)}"
        assert torch.equal(_bits(got), _bits(want)), f"{where}: tensor bytes differ"
    elif isinstance(want, np.ndarray):
        got = np.asarray(got)
        assert got.dtype == want.dtype and got.shape == want.shape, where
        assert got.tobytes() == want.tobytes(), f"{where}: array bytes differ"
    elif isinstance(want, dict):
        assert isinstance(got, dict), f"{where}: {type(got)} is not a dict"
        assert set(got) == set(want), f"{where}: keys {sorted(map(str, got))} != {sorted(map(str, want))}"
        for k in want:
            assert_identical(got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, list | tuple):
        assert isinstance(got, list | tuple), f"{where}: {type(got)} is not a sequence"
        assert len(got) == len(want), f"{where}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_identical(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        assert isinstance(got, float | int) and np.float64(got).tobytes() == np.float64(want).tobytes(), (
            f"{where}: {got!r} != {want!r}"
        )
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"
