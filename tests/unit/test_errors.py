"""One error root (docs/errors.md): every exception class the project defines derives from
TidelineError, but for the few that carry control flow inside a module and never reach a user."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import services
import spark_jobs
from spark_jobs.model.errors import ChangeError, ConfigurationError, StoreError, StoreStateError, TidelineError

# Caught where they are raised, never shown to a user (docs/errors.md, "Not under the root").
CONTROL_FLOW = {"services.stack.service.Unhealthy", "services.up.lifecycle.Interrupted",
                "services.stack.runner._Stopping", "services.api.stores.NotFound", "services.api.stores.Unavailable",
                "services.api.validation.BadInput"}


def project_exceptions() -> list[type[BaseException]]:
    found = []
    for package in (services, spark_jobs):
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            loaded = importlib.import_module(module.name)
            found += [cls for _, cls in inspect.getmembers(loaded, inspect.isclass)
                      if issubclass(cls, BaseException) and cls.__module__ == module.name]
    return found


def test_every_exception_the_project_defines_derives_from_the_root_unless_it_is_control_flow():
    classes = project_exceptions()
    assert len(classes) > 20
    stray = [f"{cls.__module__}.{cls.__qualname__}" for cls in classes
             if not issubclass(cls, TidelineError) and f"{cls.__module__}.{cls.__qualname__}" not in CONTROL_FLOW]
    assert stray == []


@pytest.mark.parametrize(("name", "kind"), [
    ("spark_jobs.model.config.PipelineConfigError", ConfigurationError),
    ("spark_jobs.model.sink_registry.UnknownSinkError", ConfigurationError),
    ("spark_jobs.model.settings.JobSettingsError", ConfigurationError),
    ("services.settings.SettingsError", ConfigurationError),
    ("spark_jobs.sinks.elasticsearch._store.ElasticsearchSinkError", StoreError),
    ("spark_jobs.sinks.redis.CacheMismatchError", StoreStateError),
    ("spark_jobs.changes.record.DecodeError", ChangeError),
])
def test_each_error_is_of_the_kind_the_tree_in_the_docs_gives(name, kind):
    module, _, attribute = name.rpartition(".")
    assert issubclass(getattr(importlib.import_module(module), attribute), kind)
