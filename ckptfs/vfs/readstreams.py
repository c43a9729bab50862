"""The readers of one open file, one stream per handle: what each one's requests tell.

Why per handle: a checkpoint library's loader (torch.distributed.checkpoint's
FileSystemReader) reads every item of a file by offset and length, and several readers
(ranks, threads) may read one file at once. With one state per file their requests
interleave, so no read looks sequential and the readahead and the page-cache pushes
(vfs/pagepush.py) stop; a stream per handle keeps each reader's pattern whole. The kernel
sends a page-cache reader's requests (its read-ahead included) with the handle of the
open file they are made for, so a handle is a reader.

Sequential: a request in the chunk of the stream's last one or the next (a reader moving
on), or one that begins where one of the stream's recent requests ended. The latter is a
reader back from a look elsewhere: torch.load, reading one DCP item, reads the item's zip
directory at its end first and then its data from the start, which the kernel's
read-ahead of the first look had already asked up to.

Warm (no readahead, no push): a request that jumps forward over bytes nobody served or
pushed to this stream's knowledge means the kernel had them cached (a warm read refilling
the few pages the kernel reclaimed); it ends at a seek back or when requests run on
without a gap over a chunk's end (docs/performance-history.md, "Warm reads").
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Container
from dataclasses import dataclass, field

# Handles whose streams a file keeps (the least recently reading go first): a stream is
# only a hint, so one forgotten (or a reused handle number's) costs a sequential request.
MAX_STREAMS = 32
# Request ends a stream remembers for "begins where a recent request ended".
RECENT_ENDS = 8


@dataclass
class ReadStream:
    last_idx: int = -2  # the chunk of the last request (-2: none yet)
    req_end: int = 0  # where the last page-cache request ended
    # The end of the highest request since the last seek back: pushes of chunks this
    # stream read ahead stop there (the pages above were not asked for yet).
    read_hi: int = 0
    warm: bool = False
    ends: deque[int] = field(default_factory=lambda: deque(maxlen=RECENT_ENDS))

    def sequential(self, off: int, idx: int) -> bool:
        """Whether a request at ``off`` in chunk ``idx`` goes on with this stream (and it
        now stands there)."""
        seq = (idx in (self.last_idx, self.last_idx + 1) or (idx == 0 and self.last_idx == -2)
               or off in self.ends)
        self.last_idx = idx
        return seq

    def note(self, off: int, end: int, cs: int, pushed: Container[int]) -> None:
        """A page-cache request for [off, end) (chunks of ``cs`` bytes; ``pushed``: the
        chunks the file pushed pages of): warm or not, and where its pushes stop."""
        prev, self.req_end = self.req_end, end
        # A seek back brings read_hi back with the reader (torch.load reads a zip's
        # directory at the end first).
        self.read_hi = end if off < prev else max(self.read_hi, end)
        over_an_end = end % cs == 0 or off // cs != (end - 1) // cs
        if off > prev and off not in self.ends:
            gap = range(prev // cs, (off - 1) // cs + 1)
            if not all(i in pushed for i in gap):
                self.warm = True
        elif off < prev or over_an_end:  # a seek back, or on without a gap over an end
            self.warm = False

    def ended(self, end: int) -> None:
        """A request of this stream ended at ``end`` (after ``sequential``)."""
        if not self.ends or self.ends[-1] != end:
            self.ends.append(end)


class ReadStreams(OrderedDict[int | None, ReadStream]):
    """A file's streams by handle number (None: a reader without one), the most recent last."""

    def of(self, key: int | None) -> ReadStream:
        st = self.get(key)
        if st is None:
            st = self[key] = ReadStream()
            while len(self) > MAX_STREAMS:
                self.popitem(last=False)
        else:
            self.move_to_end(key)
        return st
