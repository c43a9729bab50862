"""Load a module of scripts/ (benchio.py, dcpstats.py, ...) by file, for a test; nothing
edits sys.path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(stem: str) -> ModuleType:
    """scripts/STEM.py as module ``ckptfs_test_STEM`` (loaded once per process)."""
    name = f"ckptfs_test_{stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{stem}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
