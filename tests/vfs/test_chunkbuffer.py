"""ChunkBuffer (parts and staged) against a bytearray model."""

import ctypes
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptfs.codec import frame
from ckptfs.codec import staged as staged_mod
from ckptfs.codec.staged import Staged, StagePool
from ckptfs.errors import CorruptChunk
from ckptfs.vfs.chunkbuffer import ChunkBuffer

ops = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, 600), st.binary(min_size=1, max_size=200)),
        st.tuples(st.just("truncate"), st.integers(0, 700), st.just(b"")),
        st.tuples(st.just("copy"), st.just(0), st.just(b"")),
    ),
    max_size=40,
)


def check_against_bytearray(buf: ChunkBuffer, seq: list[tuple[str, int, bytes]]) -> None:
    """Apply ``seq`` to ``buf`` and to a bytearray model; after each step they agree."""
    model = bytearray()
    for op, at, data in seq:
        if op == "write":
            if at > len(model):
                model.extend(bytes(at - len(model)))
            model[at : at + len(data)] = data
            buf.write(at, data)
        elif op == "truncate":
            del model[at:]
            buf.truncate(at)
        else:
            old = buf
            buf = buf.copy()
            old.write(0, b"must not leak into the copy")
        assert buf.length == len(model)
        assert buf.joined() == bytes(model)
        lo, hi = sorted((at % (len(model) + 1), (at * 7) % (len(model) + 1)))
        assert buf.slice(lo, hi) == bytes(model[lo:hi])


@given(ops)
def test_matches_bytearray(seq: list[tuple[str, int, bytes]]) -> None:
    check_against_bytearray(ChunkBuffer(), seq)


def test_many_small_appends_keep_few_parts() -> None:
    buf = ChunkBuffer()
    for i in range(5000):
        buf.write(buf.length, bytes([i % 256]) * 3)
    assert len(buf.parts) <= 128
    assert buf.joined() == b"".join(bytes([i % 256]) * 3 for i in range(5000))


@given(ops)
def test_staged_matches_bytearray(seq: list[tuple[str, int, bytes]]) -> None:
    # A staged chunk (codec/staged.py) behaves as the parts do; its pool buffer may hold
    # an earlier chunk's bytes, which must never show (holes read as zeros).
    pool = StagePool(chunk_size=1024, keep=4)
    dirty = pool.take()
    dirty.write(0, b"\xff" * 1024)
    pool.give(dirty)
    check_against_bytearray(ChunkBuffer(staged=pool.take()), seq)


def test_staged_frame_is_the_buffer_itself() -> None:
    pool = StagePool(chunk_size=8192, keep=1)
    staged = pool.take()
    staged.write(0, b"a" * 5000)
    staged.write(5000, memoryview(bytearray(b"b" * 100)))
    digest = frame.digest_of_parts([staged.body()])
    framed = staged.frame(digest)
    assert bytes(framed) == b"".join(bytes(p) for p in frame.encode([b"a" * 5000 + b"b" * 100], digest))
    assert ctypes.addressof(ctypes.c_char.from_buffer(framed)) % 4096 == 0  # O_DIRECT as it is
    assert frame.decode(bytes(framed), digest) == b"a" * 5000 + b"b" * 100


@given(ops)
def test_save_chunk_matches_bytearray(seq: list[tuple[str, int, bytes]]) -> None:
    # A save's chunk (a pool to stage in): parts until an overwrite stages it in place.
    pool = StagePool(chunk_size=1024, keep=4)
    dirty = pool.take()
    dirty.write(0, b"\xff" * 1024)
    pool.give(dirty)
    buf = ChunkBuffer(pool=pool)
    check_against_bytearray(buf, seq)
    for staged in buf.buffers():
        pool.give(staged)
    assert pool.in_use == 0


def test_save_chunk_keeps_its_parts_uncopied() -> None:
    # Appends to a save's chunk keep pyfuse3's bytes objects themselves, and the store is
    # given those; an overwrite then stages the chunk (one buffer of the pool).
    pool = StagePool(chunk_size=4096, keep=1)
    writes = [bytes([i]) * 1024 for i in range(3)]
    buf = ChunkBuffer(pool=pool)
    for i, w in enumerate(writes):
        buf.write(i * 1024, w)
    content = buf.content()
    assert isinstance(content, list) and buf.staged is None and pool.in_use == 0
    assert len(content) == 3 and all(p is w for p, w in zip(content, writes, strict=True))
    buf.write(100, b"x" * 10)
    assert isinstance(buf.content(), Staged) and pool.in_use == 1
    expect = bytearray(b"".join(writes))
    expect[100:110] = b"x" * 10
    assert buf.joined() == bytes(expect)
    assert len(buf.buffers()) == 1 and buf.staged is None


@given(st.lists(st.binary(min_size=0, max_size=300 * 1024), max_size=6), st.integers(0, 3))
def test_fill_copies_and_hashes_parts_in_one_pass(parts: list[bytes], kind: int) -> None:
    # A save's parts assembled by the store's worker (Staged.fill): pieces across the
    # fill's own piece size, bytes, bytearrays and views (a truncated part is a read-only
    # view): the body is their bytes and the digest theirs, as hashing the parts gave.
    given_parts: list[frame.Buffer] = [
        p if kind == 0 else bytearray(p) if kind == 1 else
        memoryview(p + b"tail")[: len(p)] if kind == 2 else memoryview(bytearray(p))
        for p in parts
    ]
    n = sum(len(p) for p in parts)
    staged = StagePool(chunk_size=max(n, 1), keep=1).take()
    piece, staged_mod.FILL_PIECE = staged_mod.FILL_PIECE, 64 * 1024  # parts span pieces
    try:
        digest = staged.fill(given_parts)
    finally:
        staged_mod.FILL_PIECE = piece
    assert staged.length == n
    assert bytes(staged.body()) == b"".join(parts)
    assert digest == frame.digest_of_parts(parts)
    assert bytes(staged.frame(digest)[frame.HEADER_SIZE :]) == b"".join(parts)


def test_fill_refuses_a_copy_that_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    class Differs:
        @staticmethod
        def memcmp(a: int, b: int, n: int) -> int:
            return 1  # as if the copy did not land as the source reads

    monkeypatch.setattr(staged_mod, "_libc", Differs)
    staged = StagePool(chunk_size=1024 * 1024, keep=1).take()
    with pytest.raises(CorruptChunk):
        staged.fill([os.urandom(4096)])


def test_fill_refuses_parts_past_the_chunk() -> None:
    staged = StagePool(chunk_size=4096, keep=1).take()
    with pytest.raises(ValueError):
        staged.fill([bytes(4096), b"x"])
