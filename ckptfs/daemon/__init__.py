"""The daemon without its front end: built from its config (build.py), its catalog made
ready for it (restore.py), its services run and stopped in order (services.py). mount.py
serves it through FUSE; another front end would call the same."""
