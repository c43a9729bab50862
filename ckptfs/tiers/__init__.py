"""Tiers: places that hold chunk frames (local directories now; S3 later)."""
