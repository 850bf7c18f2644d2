import base64

from services.stack.kafka import new_cluster_id


def test_an_id_starting_with_a_dash_is_drawn_again():
    # 0xF8 puts 0b111110 (index 62, '-') in the first base64 character.
    draws = iter([bytes([0xF8]) + bytes(15), bytes(range(16))])
    cluster_id = new_cluster_id(lambda: next(draws))
    assert cluster_id == base64.urlsafe_b64encode(bytes(range(16))).decode().rstrip("=")


def test_random_ids_are_22_characters_of_16_bytes_and_never_start_with_a_dash():
    ids = {new_cluster_id() for _ in range(2000)}
    assert len(ids) == 2000
    for cluster_id in ids:
        assert len(cluster_id) == 22 and not cluster_id.startswith("-")
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16
