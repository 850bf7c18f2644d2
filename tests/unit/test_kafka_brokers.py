"""The cluster profile's Kafka brokers: their configuration, ports and the replication of the topics."""

from pathlib import Path

import pytest

from services.settings import StackSettings
from services.stack import kafka
from services.stack.templates import render

THREE = StackSettings(kafka_brokers=3, kafka_port=19092, kafka_controller_port=19093, kafka_broker_port=19094)


def _properties(path: Path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def _rendered(settings: StackSettings, number: int, tmp_path: Path) -> dict[str, str]:
    values = kafka.broker_values(settings, number)
    return _properties(render(kafka.KAFKA_ASSETS / "server.properties", tmp_path / f"{number}.properties", values))


def test_the_first_broker_is_the_controller_and_the_others_brokers_of_its_quorum(tmp_path):
    first, third = _rendered(THREE, 1, tmp_path), _rendered(THREE, 3, tmp_path)
    assert (first["process.roles"], first["node.id"]) == ("broker,controller", "1")
    assert first["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert (third["process.roles"], third["node.id"], third["listeners"]) == ("broker", "3", "PLAINTEXT://127.0.0.1:19095")
    assert first["controller.quorum.voters"] == third["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert third["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19095"
    assert first["log.dirs"] != third["log.dirs"]


def test_three_brokers_replicate_every_topic_three_times_and_a_write_waits_for_two(tmp_path):
    first = _rendered(THREE, 1, tmp_path)
    assert (first["default.replication.factor"], first["min.insync.replicas"]) == ("3", "2")
    assert first["offsets.topic.replication.factor"] == first["transaction.state.log.replication.factor"] == "3"
    single = _rendered(StackSettings(), 1, tmp_path)
    assert (single["default.replication.factor"], single["min.insync.replicas"]) == ("1", "1")
    assert (StackSettings(kafka_brokers=5).kafka_replication, StackSettings(kafka_brokers=2).kafka_min_insync) == (3, 1)


def test_clients_bootstrap_from_every_broker_so_any_one_may_be_down():
    assert THREE.kafka_bootstrap == "127.0.0.1:19092,127.0.0.1:19094,127.0.0.1:19095"
    assert StackSettings().kafka_bootstrap == "127.0.0.1:9092"
    assert {"kafka_broker_port": 19094, "kafka_broker_3_port": 19095}.items() <= THREE.ports().items()


def test_a_broker_port_taken_by_another_service_is_refused_naming_both():
    with pytest.raises(ValueError, match="kafka_broker_3_port and connect_port are both set to port 8083"):
        StackSettings(kafka_brokers=3, kafka_broker_port=8082)

