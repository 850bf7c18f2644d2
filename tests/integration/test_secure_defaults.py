"""Secure defaults, checked on the running services: nothing listens beyond loopback unless told to
(every socket each process opens, not only its configured port), and committed config holds no secret."""

from __future__ import annotations

import json
import os

import pytest

from services.capture.connector import registration
from services.settings import StackSettings
from services.stack import jars, process, runner
from spark_jobs.runtime.session import build_session
from tests.listening import descendants, listening, not_loopback

pytestmark = pytest.mark.stack


def test_every_stack_service_listens_on_loopback_only(stack: StackSettings):
    for service in runner.select(stack):
        started = process.running(runner.pid_file(stack, service))
        assert started, f"{service.name} is not running"
        sockets = listening(descendants(started.pid))
        assert sockets, f"{service.name} listens on nothing we can see"
        assert not not_loopback(sockets), f"{service.name} listens beyond loopback: {not_loopback(sockets)}"


def test_a_local_spark_driver_listens_on_loopback_only(stack: StackSettings):
    build_session("tideline-secure-defaults-test", jars.bundle_dir(stack, "spark"), master="local[1]")
    sockets = listening(descendants(os.getpid()))
    assert sockets, "the Spark JVM listens on nothing we can see"
    assert not not_loopback(sockets), f"the Spark driver listens beyond loopback: {not_loopback(sockets)}"


def test_committed_connector_config_names_secrets_only_through_the_env_provider():
    template = json.loads(registration.TEMPLATE.read_text())
    assert template["database.password"] == "${env:TIDE_CDC_PASSWORD}"
    assert template["database.user"] == "${env:TIDE_CDC_USER}"
    secret_like = {k: v for k, v in template.items() if "password" in k.lower() or "secret" in k.lower()}
    assert all(value.startswith("${env:") for value in secret_like.values()), secret_like
