"""Chunks: the frame format and the ChunkStore that stripes and verifies them."""
