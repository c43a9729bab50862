"""The ground floor under the tiers: the self-verifying chunk frame (frame.py) and the lz4
codec for remote copies (compress.py). Tiers may import this package; it imports nothing
of ckptfs but errors."""
