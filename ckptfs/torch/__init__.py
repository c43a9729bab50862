"""ckptfs's torch plugin (docs/direct-path.md, "The torch plugin"): DCP's storage writer
and reader, and a file object for torch.load and safetensors, over the direct path; the
mount path where there is none (said once). Imports torch and ckptfs.client, nothing of
the daemon."""

from .dcp import DirectFileSystem, DirectReader, DirectWriter, open_read

__all__ = ["DirectFileSystem", "DirectReader", "DirectWriter", "open_read"]
