from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

import taskgate.ids
from taskgate.clock import ManualClock, utc
from taskgate.codec import encode_value
from taskgate.ids import encode_ulid, new_id, new_ids


def test_ids_are_26_character_ulids_sorted_by_creation() -> None:
    ids = [new_id() for _ in range(2000)]
    assert all(len(i) == 26 for i in ids)
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


def test_batches_of_ids_sort_among_single_ids_in_the_order_they_were_made() -> None:
    made = [new_id(), *new_ids(1000), new_id(), *new_ids(1), *new_ids(0), new_id()]
    assert len(made) == 1004
    assert all(len(i) == 26 for i in made)
    assert made == sorted(made)
    assert len(set(made)) == len(made)


def test_a_batch_that_would_wrap_the_random_part_moves_to_the_next_millisecond(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    future_ms = 2**47  # far ahead of the clock, so the generator stays in that millisecond
    top = 2**80 - 1
    monkeypatch.setattr(taskgate.ids, "_last_ms", future_ms)
    monkeypatch.setattr(taskgate.ids, "_last_rand", top - 1)
    last_of_that_ms = encode_ulid(future_ms, top)
    batch = new_ids(3)
    assert batch == sorted(batch)
    assert all(i > last_of_that_ms for i in batch)
    assert {i[:10] for i in batch} == {encode_ulid(future_ms + 1, 0)[:10]}


def _reference_ulid(ms: int, rand: int) -> str:
    """The ULID spec's encoding, digit by digit: 10 digits of time, then 16 of randomness."""
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    value = (ms << 80) | rand
    return "".join(alphabet[(value >> (5 * (25 - n))) & 31] for n in range(26))


@given(st.integers(0, 2**48 - 1), st.integers(0, 2**80 - 1))
def test_the_fast_encoding_is_the_ulid_specs(ms: int, rand: int) -> None:
    assert encode_ulid(ms, rand) == _reference_ulid(ms, rand)


@given(
    st.integers(0, 2**47),
    st.integers(0, 2**80 - 3_000) | st.sampled_from([1_021, 1_022, 1_023, 2**20 - 2]),
    st.integers(1, 2_500),
)
def test_batch_ids_are_the_ulid_specs_encoding(ms: int, rand: int, size: int) -> None:
    # Batches cross blocks of 1,024 random values (the last two digits wrap there).
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(taskgate.ids, "_last_ms", ms + 2**47)  # ahead of any clock: stays put
        patch.setattr(taskgate.ids, "_last_rand", rand)
        batch = new_ids(size)
        single = new_id()
    expected = [_reference_ulid(ms + 2**47, rand + n) for n in range(1, size + 2)]
    assert [*batch, single] == expected


def test_a_known_ulid_and_the_ids_time_part() -> None:
    assert encode_ulid(0, 0) == "0" * 26
    assert encode_ulid(2**48 - 1, 2**80 - 1) == "7" + "Z" * 25  # the largest ULID
    ms = 1_469_918_176_385  # the example time of the ULID spec: "01ARYZ6S41"
    assert encode_ulid(ms, 0)[:10] == "01ARYZ6S41"


def test_ids_made_by_many_threads_are_unique() -> None:
    made: list[str] = []
    lock = threading.Lock()

    def make() -> None:
        batch = [new_id() for _ in range(500)]
        with lock:
            made.extend(batch)

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(made)) == 4000


def test_payload_encoding_keeps_bytes_and_none_and_json_encodes_the_rest() -> None:
    assert encode_value(b"\x00raw") == b"\x00raw"
    assert encode_value(None) is None
    assert json.loads(encode_value({"q": "x", "n": [1, 2]}) or b"") == {"q": "x", "n": [1, 2]}
    assert encode_value(bytearray(b"ab")) == b"ab"


@pytest.mark.parametrize("bad", [object(), {1, 2}, float("nan"), {"k": object()}])
def test_unserialisable_payloads_raise_type_error_naming_the_payload(bad: object) -> None:
    with pytest.raises(TypeError, match="payload"):
        encode_value(bad)


def test_manual_clock_moves_only_forward_when_told() -> None:
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    assert clock.now() == datetime(2030, 1, 1, tzinfo=UTC)
    assert clock.advance(1.5) == datetime(2030, 1, 1, 0, 0, 1, 500000, tzinfo=UTC)
    clock.advance(timedelta(minutes=1))
    assert clock.now() == datetime(2030, 1, 1, 0, 1, 1, 500000, tzinfo=UTC)
    with pytest.raises(ValueError, match="cannot go back"):
        clock.advance(-1)
    with pytest.raises(ValueError, match="cannot go back"):
        clock.set(datetime(2029, 1, 1, tzinfo=UTC))


def test_utc_normalises_naive_and_foreign_zones() -> None:
    naive = datetime(2030, 1, 1, 12)
    assert utc(naive).tzinfo is UTC
    from datetime import timezone

    plus2 = datetime(2030, 1, 1, 14, tzinfo=timezone(timedelta(hours=2)))
    assert utc(plus2) == datetime(2030, 1, 1, 12, tzinfo=UTC)
