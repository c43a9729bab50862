"""Format checks of a checkpoint's files without its framework (the restore drill's
"does it load as its framework wrote it"): ``check_checkpoint(files, layout)``.

check.py dispatches by layout; files.py (the file interface and ``DirFiles``),
torchzip.py, stfile.py (safetensors), dcp.py with restricted.py (DCP ``.metadata``
without torch), meta.py (JSON, trackers). Nothing here imports torch.
"""

from __future__ import annotations

from .check import check_checkpoint
from .files import CheckpointFiles, DirFiles, FormatProblem, SubFiles

__all__ = ["CheckpointFiles", "DirFiles", "FormatProblem", "SubFiles", "check_checkpoint"]
