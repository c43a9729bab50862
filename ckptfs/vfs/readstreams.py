"""The readers of one open file, one stream per handle: what each one's requests tell.

Why per handle: a checkpoint library's loader (torch.distributed.checkpoint's
FileSystemReader) reads every item of a file by offset and length, and several readers
(ranks, threads) may read one file at once. With one state per file their requests
interleave, so no read looks sequential and the readahead and the page-cache pushes
(vfs/pagepush.py) stop; a stream per handle keeps each reader's pattern whole. The kernel
sends a page-cache reader's requests (its read-ahead included) with the handle of the
open file they are made for, so a handle is a reader.

Sequential: a request in the chunk of the stream's last one or the next (a reader moving
on), or one that begins where one of the stream's recent runs of requests ended. The latter is a
reader back from a look elsewhere: torch.load, reading one DCP item, reads the item's zip
directory at its end first and then its data from the start, which the kernel's
read-ahead of the first look had already asked up to.

Pushes of chunks read ahead for a stream skip what its runs asked for (``asked``): the
pages of a run were replied to. Only the run that holds a piece counts: the look at an
item's end must not stop the pushes of the item's chunks before it, which the reader
comes back to (it did, with one high-water mark per file: a DCP item's middle chunks
went through replies).

Warm (no readahead, no push): a request that jumps forward over bytes nobody served or
pushed to this stream's knowledge means the kernel had them cached (a warm read refilling
the few pages the kernel reclaimed); it ends at a seek back or when requests run on
without a gap over a chunk's end (docs/performance-history.md, "Warm reads").
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container
from dataclasses import dataclass

# Handles whose streams a file keeps (the least recently reading go first): a stream is
# only a hint, so one forgotten (or a reused handle number's) costs a sequential request.
MAX_STREAMS = 32
# Runs (stretches of contiguous requests) a stream remembers.
MAX_RUNS = 8


@dataclass
class ReadStream:
    last_idx: int = -2  # the chunk of the last request (-2: none yet)
    req_end: int = 0  # where the last page-cache request ended
    warm: bool = False
    # Its recent runs, (start, end) of contiguous requests, the newest last: a request that
    # begins at a run's end continues it. Replaced whole at each request (never changed in
    # place), so a push's worker thread reads it without a lock (``asked``).
    runs: tuple[tuple[int, int], ...] = ()
    continues: bool = False  # the current request begins where a run ended

    def begin(self, off: int, end: int) -> None:
        """A request of this stream for [off, end): it extends the run it touches (or
        starts one), before it is answered, so no push copies what it asked for."""
        self.continues = any(e == off for _, e in self.runs)
        runs = list(self.runs)
        for k, (s, e) in enumerate(runs):
            if s <= off <= e:
                runs[k] = (s, max(e, end))
                runs.append(runs.pop(k))
                break
        else:
            runs.append((off, end))
        self.runs = tuple(runs[-MAX_RUNS:])

    def sequential(self, idx: int) -> bool:
        """Whether the current request, in chunk ``idx``, goes on with this stream (and it
        now stands there)."""
        seq = (idx in (self.last_idx, self.last_idx + 1) or (idx == 0 and self.last_idx == -2)
               or self.continues)
        self.last_idx = idx
        return seq

    def note(self, off: int, end: int, cs: int, pushed: Container[int]) -> None:
        """A page-cache request for [off, end) (chunks of ``cs`` bytes; ``pushed``: the
        chunks the file pushed pages of; after ``begin``): warm or not."""
        prev, self.req_end = self.req_end, end
        over_an_end = end % cs == 0 or off // cs != (end - 1) // cs
        if off > prev and not self.continues:
            gap = range(prev // cs, (off - 1) // cs + 1)
            if not all(i in pushed for i in gap):
                self.warm = True
        elif off < prev or over_an_end:  # a seek back, or on without a gap over an end
            self.warm = False

    def asked(self, off: int) -> int:
        """Where the run that holds ``off`` ends (the reader asked for [off, there)), or
        ``off`` if none does. Called from a push's worker thread."""
        for s, e in self.runs:
            if s <= off < e:
                return e
        return off


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
