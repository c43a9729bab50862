"""ChunkBuffer against a bytearray model."""

from hypothesis import given
from hypothesis import strategies as st

from ckptfs.vfs.chunkbuffer import ChunkBuffer

ops = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, 600), st.binary(min_size=1, max_size=200)),
        st.tuples(st.just("truncate"), st.integers(0, 700), st.just(b"")),
        st.tuples(st.just("copy"), st.just(0), st.just(b"")),
    ),
    max_size=40,
)


@given(ops)
def test_matches_bytearray(seq: list[tuple[str, int, bytes]]) -> None:
    buf, model = ChunkBuffer(), bytearray()
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


def test_many_small_appends_keep_few_parts() -> None:
    buf = ChunkBuffer()
    for i in range(5000):
        buf.write(buf.length, bytes([i % 256]) * 3)
    assert len(buf.parts) <= 128
    assert buf.joined() == b"".join(bytes([i % 256]) * 3 for i in range(5000))
