"""The commands wing: what each ``ckptfs`` subcommand runs (cli.py parses the arguments).

Commands read a live mount from beside it (live.py: the mount holding a path, its catalog
read-only, the daemon's statistics) or talk to the daemon through the mount (control
xattrs); fsck works offline under the state dir's lock. The daemon never imports this
package (an import-linter contract in pyproject.toml).
"""
