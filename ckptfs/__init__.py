"""ckptfs: a checkpoint-aware FUSE filesystem."""

__version__ = "0.1.0"
