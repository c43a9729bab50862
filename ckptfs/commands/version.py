"""`ckptfs --version`: the versions an operator reports with a bug, and checks after an
install: ckptfs, pyfuse3, the libfuse that pyfuse3 loaded (``fuse_pkgversion()`` through
ctypes) and the catalog schema this ckptfs writes. Loaded only for --version."""

from __future__ import annotations

import ctypes
import platform
from contextlib import suppress

from .. import __version__


def _libfuse_path() -> str | None:
    """The libfuse3 file mapped into this process (pyfuse3 links it), or None."""
    with suppress(OSError), open("/proc/self/maps") as f:
        for line in f:
            path = line.split(maxsplit=5)[-1].strip()
            if "/libfuse3.so" in path:
                return path
    return None


def libfuse_version() -> tuple[str | None, str | None]:
    """(version, library path) of the libfuse pyfuse3 uses; None where it cannot be told."""
    try:
        import pyfuse3  # noqa: F401  (loads the libfuse it was built against)
    except ImportError:
        return None, None
    path = _libfuse_path()
    try:
        lib = ctypes.CDLL(path or "libfuse3.so.3")
        fn = lib.fuse_pkgversion
    except (OSError, AttributeError):  # no such library, or a libfuse before 3.0
        return None, path
    fn.restype = ctypes.c_char_p
    raw = fn()
    return (raw.decode(errors="replace") if raw else None), path


def versions() -> dict[str, str | int | None]:
    from ..catalog.schema import SCHEMA_VERSION

    try:
        import pyfuse3

        pyfuse3_version: str | None = str(pyfuse3.__version__)
    except ImportError:
        pyfuse3_version = None
    libfuse, path = libfuse_version()
    return {"ckptfs": __version__, "pyfuse3": pyfuse3_version, "libfuse": libfuse,
            "libfuse_path": path, "catalog_schema": SCHEMA_VERSION,
            "python": platform.python_version()}


def version_text() -> str:
    v = versions()
    fuse = str(v["libfuse"] or "unknown")
    if v["libfuse_path"]:
        fuse += f" ({v['libfuse_path']})"
    return (f"ckptfs {v['ckptfs']}\npyfuse3 {v['pyfuse3'] or 'not installed'}\n"
            f"libfuse {fuse}\ncatalog schema {v['catalog_schema']}\npython {v['python']}")
