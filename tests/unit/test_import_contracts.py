"""Every module of ckptfs/ sits in the layers contract of pyproject.toml (lint-imports
checks the arrows; this checks that no module is left out of the layers, where no arrow
of it would be checked)."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def top_level_modules() -> set[str]:
    pkg = REPO / "ckptfs"
    mods = {f"ckptfs.{p.stem}" for p in pkg.glob("*.py") if p.stem not in ("__init__", "__main__")}
    mods |= {f"ckptfs.{p.parent.name}" for p in pkg.glob("*/__init__.py")}
    return mods


def test_every_module_is_in_a_layer() -> None:
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())
    layers = [c for c in cfg["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    assert len(layers) == 1
    named = {m.strip() for layer in layers[0]["layers"] for m in layer.split("|")}
    missing = top_level_modules() - named
    assert not missing, f"modules in no layer of pyproject.toml: {sorted(missing)}"
    assert named <= top_level_modules(), sorted(named - top_level_modules())
