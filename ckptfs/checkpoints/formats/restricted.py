"""A restricted unpickler for torch DCP's ``.metadata`` that needs no torch.

``.metadata`` is a pickle of torch.distributed.checkpoint classes. Loading it with pickle
would import torch and run whatever globals the file names; this unpickler resolves only
the few globals a DCP metadata file uses, each to a plain stand-in with no behaviour
(``Obj``: a bag of attributes), and refuses every other global before anything runs:
``find_class`` is where pickle resolves GLOBAL, STACK_GLOBAL and extension-code opcodes,
and persistent ids are refused too, so nothing else can name a callable.
"""

from __future__ import annotations

import io
import pickle
from collections import OrderedDict
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

_DCP = "torch.distributed.checkpoint."

# Bytes per element of torch's dtypes (None: sub-byte or quantized).
TORCH_DTYPES: dict[str, int | None] = {
    "float64": 8, "double": 8, "float32": 4, "float": 4, "float16": 2, "half": 2,
    "bfloat16": 2, "complex128": 16, "cdouble": 16, "complex64": 8, "cfloat": 8,
    "complex32": 4, "chalf": 4, "int64": 8, "long": 8, "int32": 4, "int": 4, "int16": 2,
    "short": 2, "int8": 1, "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1, "qint8": 1, "quint8": 1, "qint32": 4,
    "quint4x2": None, "quint2x4": None, "bits8": 1, "bits16": 2,
}


class ForbiddenGlobal(pickle.UnpicklingError):
    """The pickle names a global outside the allowed set (the message names it)."""


class Obj:
    """Stand-in for a dataclass of torch.distributed.checkpoint: pickle creates it with
    ``__new__`` and fills it with ``__setstate__``; it only holds attributes."""

    kind = "object"

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
            state = {**(state[0] or {}), **state[1]}  # (dict, slots) state
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.__dict__["state"] = state

    def __repr__(self) -> str:
        return f"<{self.kind} {self.__dict__!r}>"


class TensorPropertiesObj(Obj):
    kind = "TensorProperties"

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 5:  # its own __getstate__
            names = ("dtype", "layout", "requires_grad", "memory_format", "pin_memory")
            self.__dict__.update(zip(names, state, strict=True))
        else:
            super().__setstate__(state)


class DType:
    """Stand-in for a torch.dtype (``torch.float32`` pickles as the global itself)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.itemsize = TORCH_DTYPES[name]

    def __repr__(self) -> str:
        return f"torch.{self.name}"


def _stand_in(kind: str) -> type[Obj]:
    return type(kind, (Obj,), {"kind": kind})


def _value(*args: Any) -> Any:
    """An enum member pickled as ``Enum(value)``, torch.Size as ``Size(tuple)``."""
    return args[0] if args else ()


def _layout(name: str) -> str:  # torch.serialization._get_layout("torch.strided")
    return str(name)


def _allowed() -> dict[tuple[str, str], Any]:
    out: dict[tuple[str, str], Any] = {
        ("torch", "Size"): _value,
        ("torch.serialization", "_get_layout"): _layout,
        (_DCP + "metadata", "TensorProperties"): TensorPropertiesObj,
        (_DCP + "metadata", "_MEM_FORMAT_ENCODING"): _value,
        (_DCP + "planner", "WriteItemType"): _value,
        (_DCP + "planner", "LoadItemType"): _value,
        ("pathlib", "PosixPath"): PurePosixPath,
        ("pathlib", "PurePosixPath"): PurePosixPath,
        ("pathlib", "WindowsPath"): PureWindowsPath,
        ("pathlib", "PureWindowsPath"): PureWindowsPath,
        ("collections", "OrderedDict"): OrderedDict,
    }
    for cls in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                "ChunkStorageMetadata", "MetadataIndex", "StorageMeta"):
        out[(_DCP + "metadata", cls)] = _stand_in(cls)
    for cls in ("SavePlan", "WriteItem", "TensorWriteData", "LoadPlan", "ReadItem"):
        out[(_DCP + "planner", cls)] = _stand_in(cls)
    out[(_DCP + "filesystem", "_StorageInfo")] = _stand_in("_StorageInfo")
    for name in TORCH_DTYPES:
        out[("torch", name)] = DType(name)
    return out


ALLOWED: dict[tuple[str, str], Any] = _allowed()


class RestrictedUnpickler(pickle.Unpickler):
    """Resolves only ``ALLOWED`` globals; any other raises ``ForbiddenGlobal`` unresolved."""

    def find_class(self, module: str, name: str) -> Any:
        got = ALLOWED.get((module, name))
        if got is None:
            raise ForbiddenGlobal(f"{module}.{name}")
        return got

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not part of a DCP metadata file")


def load_restricted(data: bytes) -> Any:
    """Unpickle ``data``; raises ``ForbiddenGlobal`` or another ``UnpicklingError`` (or the
    ValueError, EOFError... a damaged pickle gives)."""
    return RestrictedUnpickler(io.BytesIO(data)).load()


def kind_of(x: Any) -> str:
    return x.kind if isinstance(x, Obj) else type(x).__name__


