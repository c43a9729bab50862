"""`ckptfs --version` of this checkout (fast; test_wheel.py asks the installed one too):
the versions of ckptfs, pyfuse3, the libfuse pyfuse3 loaded, and the catalog schema."""

from __future__ import annotations

import re

import pyfuse3

from tests.support.mountutil import run_cli

import ckptfs
from ckptfs.catalog.schema import SCHEMA_VERSION
from ckptfs.commands.version import libfuse_version


def test_version_lines() -> None:
    res = run_cli("--version")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    libfuse, path = libfuse_version()
    assert libfuse is not None and re.fullmatch(r"3\.\d+\.\d+", libfuse), libfuse
    assert lines == [f"ckptfs {ckptfs.__version__}", f"pyfuse3 {pyfuse3.__version__}",
                     f"libfuse {libfuse} ({path})", f"catalog schema {SCHEMA_VERSION}",
                     lines[-1]]
    assert lines[-1].startswith("python 3.")
