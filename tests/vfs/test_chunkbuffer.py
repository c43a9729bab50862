"""ChunkBuffer (parts and staged) against a bytearray model."""

import ctypes

from hypothesis import given
from hypothesis import strategies as st

from ckptfs.codec import frame
from ckptfs.codec.staged import StagePool
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
