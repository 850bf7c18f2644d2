from services.jobs.dlq import count_by_sink, count_by_sink_and_topic


def letter(stage: str, offset: int, topic: str = "t", partition: int = 0) -> dict:
    return {"stage": stage, "topic": topic, "partition": partition, "offset": offset, "reason": "r"}


def test_each_sink_counts_its_own_decode_and_apply_failures():
    letters = [letter("decode:search", 1), letter("decode:cache", 1), letter("apply:cache", 2)]
    assert count_by_sink(letters) == {"search": 1, "cache": 2}


def test_a_dead_letter_delivered_twice_counts_once():
    letters = [letter("apply:warehouse", 5), letter("apply:warehouse", 5), letter("apply:warehouse", 5, partition=1)]
    assert count_by_sink(letters) == {"warehouse": 2}


def test_dead_letters_are_counted_per_sink_and_origin_topic():
    letters = [letter("decode:search", 1, topic="a"), letter("decode:search", 1, topic="b"),
               letter("apply:search", 1, topic="a"), letter("apply:cache", 3, topic="b")]
    assert count_by_sink_and_topic(letters) == {("search", "a"): 1, ("search", "b"): 1, ("cache", "b"): 1}
    assert count_by_sink(letters) == {"search": 2, "cache": 1}
