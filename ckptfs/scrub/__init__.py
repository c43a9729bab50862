"""The scrubber (docs/operations.md "The scrubber"): every copy of every chunk, on each
local tier and each remote, read and verified at a bounded rate in the background, oldest
check first, paused while a save's chunks are in memory; a bad or missing copy is recorded
bad and healed from a good one (the reader's heal: chunks/reader.py). service.py runs it,
verify.py checks one copy, progress.py keeps what status and /metrics show."""
