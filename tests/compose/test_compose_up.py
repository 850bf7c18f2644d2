"""The Docker route end to end (docs/docker.md): SQL through the published PostgreSQL port, every view
read back from Elasticsearch, Redis and the query API on their published ports, `tide verify` in
the jobs container, and the jobs container replaced under load (its checkpoints are on a volume).

The modules run in order on one compose stack (conftest.py); each test leaves the source as the
next expects it."""

from __future__ import annotations

import random
import subprocess
import time

import httpx
import psycopg
import pytest
import redis

from services.demo import workload
from services.stack import postgres
from services.up.usage import EXAMPLE_INSERT, EXAMPLE_TABLE, EXAMPLE_WORD
from spark_jobs.model.settings import SINKS
from spark_jobs.sinks.redis import row_key
from tests.compose.conftest import ComposeStack
from tests.e2e.support import CONVERGE_S, Workload
from tests.waiting import wait_until

APPLIED_S = 120  # a change in every view, on a pipeline that has just started
# The first test's set-up builds the image (`make images`: minutes on a machine that has built nothing).
pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def views(compose_stack: ComposeStack) -> Views:
    return Views(compose_stack)


class Views:
    """The search and cache views of one source row, each read where a user reads it."""

    def __init__(self, stack: ComposeStack) -> None:
        settings = stack.settings
        self.api = f"http://127.0.0.1:{settings.api_port}"
        self.elasticsearch = f"http://127.0.0.1:{settings.elasticsearch_port}"
        self.cache = redis.Redis(host="127.0.0.1", port=settings.redis_port, decode_responses=True)

    def names(self, key: int) -> dict[str, str | None]:
        """The row's `name` in each view (None where the row is absent)."""
        document = httpx.get(f"{self.elasticsearch}/{EXAMPLE_TABLE}/_doc/{key}", timeout=5)
        through_api = httpx.get(f"{self.api}/cache/{EXAMPLE_TABLE}/{key}", timeout=5)
        cached = self.cache.hget(row_key(EXAMPLE_TABLE, str(key)), "name")
        return {
            "elasticsearch": document.json()["_source"]["name"] if document.status_code == 200 else None,
            "redis": cached,  # text is stored as plain text (docs/sinks/redis.md)
            "api cache": through_api.json()["row"]["name"] if through_api.status_code == 200 else None,
        }

    def found_by_search(self, word: str) -> list[int]:
        response = httpx.get(f"{self.api}/search/{EXAMPLE_TABLE}", params={"q": word}, timeout=5)
        response.raise_for_status()
        return [hit["source"]["id"] for hit in response.json()["hits"]]


def psql(stack: ComposeStack, sql: str) -> str:
    """Run SQL with psql against the published port, as the README's Docker section does."""
    settings = stack.settings
    result = subprocess.run(
        ["psql", "-h", "127.0.0.1", "-p", str(settings.postgres_port), "-U", settings.postgres_user,
         "-d", settings.postgres_db, "-v", "ON_ERROR_STOP=1", "-tA", "-c", sql],
        env={**stack.env, "PGPASSWORD": settings.require_postgres_password()},
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_the_readme_insert_is_found_by_search_and_in_the_cache(compose_stack: ComposeStack, views: Views):
    psql(compose_stack, EXAMPLE_INSERT)
    inserted = time.monotonic()
    key = int(psql(compose_stack, "SELECT id FROM customers WHERE email = 'ada@example.com'"))

    wait_until(lambda: key in views.found_by_search(EXAMPLE_WORD), APPLIED_S, "the INSERT found by the search view")
    wait_until(lambda: set(views.names(key).values()) == {"Ada Lovelace"}, APPLIED_S, "the INSERT in every view")
    print(f"\ncompose e2e: the README's INSERT was readable from the search and cache views "
          f"{time.monotonic() - inserted:.1f}s after its commit")


def test_an_update_and_a_delete_reach_every_view(compose_stack: ComposeStack, views: Views):
    key = int(psql(compose_stack, "SELECT id FROM customers WHERE email = 'ada@example.com'"))
    psql(compose_stack, f"UPDATE customers SET name = 'Ada King', updated_at = now() WHERE id = {key}")
    # A search sees a change after the index's next refresh (a second), a read by id at once: wait for both.
    wait_until(lambda: set(views.names(key).values()) == {"Ada King"} and key in views.found_by_search("king"),
               APPLIED_S, "the UPDATE in every view")

    psql(compose_stack, f"DELETE FROM customers WHERE id = {key}")
    wait_until(lambda: set(views.names(key).values()) == {None} and key not in views.found_by_search("king"),
               APPLIED_S, "the DELETE in every view")


def committed_batches(stack: ComposeStack, sink: str) -> set[int]:
    """The micro-batches the sink's query has committed, from its checkpoint on the jobs' volume."""
    listing = stack.check("exec", "-T", "jobs", "ls", f"/var/lib/tideline/checkpoints/{sink}/commits")
    return {int(name) for name in listing.split()}


def caught_up(stack: ComposeStack) -> bool:
    """Every sink's query runs and has committed the end of its topics (GET /status, from the checkpoints)."""
    status = httpx.get(f"http://127.0.0.1:{stack.settings.api_port}/status", timeout=30).json()
    sinks = {sink["sink"]: sink for sink in status["sinks"]}
    return set(sinks) == set(SINKS) and all(s["state"] == "running" and s["records_behind"] == 0
                                            for s in sinks.values())


def test_the_jobs_container_replaced_under_load_resumes_from_its_checkpoints_and_verify_is_clean(
    compose_stack: ComposeStack,
):
    settings = compose_stack.settings
    with psycopg.connect(postgres.conninfo(settings), autocommit=True) as conn:
        workload.seed(conn, random.Random(31))
    # Two operations a second: load throughout the replacement, and few enough for the warehouse's Delta
    # tables to catch up within minutes on two busy cores (measured: about 1,000 operations at twenty a
    # second took the sinks 6 minutes to catch up, about 200 at two a second 3).
    writer = Workload(settings, seed=32, pause_s=0.5)
    writer.start()
    try:
        wait_until(lambda: writer.done >= 20 or writer.error, 120, "the workload to get going")
        # A micro-batch query's (the warehouse's): a real-time query commits only at its epochs' ends.
        before = wait_until(lambda: committed_batches(compose_stack, "warehouse"), 300,
                            "a batch committed by the first jobs container")
        # A new container, not a restarted one: only the volumes carry anything over.
        compose_stack.check("stop", "jobs")
        compose_stack.check("rm", "-f", "jobs")
        down_at = writer.done
        wait_until(lambda: writer.done >= down_at + 20 or writer.error, 120, "writes while the jobs are down")
        compose_stack.check("up", "-d", "--no-deps", "jobs")
        compose_stack.wait_healthy(["jobs"])
        up_at = writer.done
        wait_until(lambda: writer.done >= up_at + 20 or writer.error, 120, "writes after the jobs are back")
    finally:
        writer.finish()

    after = wait_until(lambda: (found := committed_batches(compose_stack, "warehouse")) != before and found, 300,
                       "a batch committed by the new jobs container")
    # Resumed, not started afresh: every batch the old container committed is there, and the new ones follow.
    assert before <= after and min(after - before) > max(before), (
        f"the new container did not resume from the checkpoints: batches before {sorted(before)[-3:]}, "
        f"after {sorted(after)[:3]}...{sorted(after)[-3:]}"
    )

    stopped = time.monotonic()
    wait_until(lambda: caught_up(compose_stack), CONVERGE_S, "every sink's query past the end of its topics",
               interval=5)
    print(f"\ncompose e2e: {writer.done} operations; "
          f"every sink caught up {time.monotonic() - stopped:.0f}s after the last")
    verify = verified_clean(compose_stack)
    assert "views match PostgreSQL" in verify.stdout, verify.stdout

    jobs_status = compose_stack.tide("jobs", "jobs", "status")
    assert jobs_status.returncode == 0, jobs_status.stdout + jobs_status.stderr
    rows = [[cell.strip() for cell in line.split("│")[1:3]] for line in jobs_status.stdout.splitlines() if "│" in line]
    for sink in SINKS:
        assert [sink, "running"] in rows, f"{sink} not running in:\n{jobs_status.stdout}"


def verified_clean(stack: ComposeStack) -> subprocess.CompletedProcess:
    """`tide verify` in the jobs container until it exits 0 (changes still in flight from Debezium may
    need another batch); fail with its last output."""
    runs: list[subprocess.CompletedProcess] = []

    def clean() -> bool:
        runs.append(stack.tide("jobs", "verify"))
        return runs[-1].returncode == 0

    try:
        wait_until(clean, 120, "tide verify in the jobs container to find every view equal to PostgreSQL", interval=10)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{runs[-1].stdout}{runs[-1].stderr}") from None
    return runs[-1]
