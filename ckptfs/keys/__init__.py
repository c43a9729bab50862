"""Keys of encrypted namespaces (docs/governance.md, "Encryption at rest and keys"): the
key-encryption key (kek.py), data keys wrapped by it (wrap.py), and the daemon's keyring
loaded from the catalog and kept current (ring.py). Between the chunk layer, which seals
frames with the keyring (codec/seal.py), and the catalog, which stores the wrapped keys."""
