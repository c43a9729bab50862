"""The direct data path's server: a Unix socket beside the mount (docs/direct-path.md)."""
