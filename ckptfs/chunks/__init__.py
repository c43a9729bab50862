"""Chunks: the chunk service (service.py) that stripes, verifies, caches and collects them."""
