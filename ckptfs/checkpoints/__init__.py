"""Checkpoint awareness: detecting checkpoints and their commit from filesystem events."""
