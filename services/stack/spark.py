"""The cluster profile's Spark standalone cluster (docs/cluster.md): Spark's own master and workers from the
installed PySpark, each a process of its own that the runner starts, probes and stops like any member.

Executors are started by the workers, not by the stack: the jobs' driver asks the master for them
(TIDE_JOB_MASTER=spark://...), and a worker that dies takes its executors with it.
"""

from __future__ import annotations

import importlib.util
import socket
from dataclasses import replace
from pathlib import Path

import httpx

from services.settings import StackSettings
from services.stack.service import Service, StackError, Unhealthy
from services.versions import PROJECT_ROOT

MASTER = "spark-master"
WORKER_PREFIX = "spark-worker-"
CONF_DIR = PROJECT_ROOT / "services" / "stack" / "assets" / "spark"
# How long the master's or a worker's web UI may take to answer (a loaded machine's two cores are shared).
HTTP_TIMEOUT_S = 10.0
# A container's services listen on every interface (docker-compose.yml sets TIDE_HOST=0.0.0.0).
_EVERY_INTERFACE = ("0.0.0.0", "::")
# The daemons' own heaps (Spark's default is 1g each): they only schedule, the executors do the work.
DAEMON_HEAP = "256m"


def spark_home() -> Path:
    """The installed PySpark package: it carries Spark's jars and bin/spark-class, which the master, the
    workers and the executors the workers start all run from."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise StackError("PySpark is not installed: run `make setup`")
    return Path(spec.origin).parent


def master_url(settings: StackSettings) -> str:
    return f"spark://{settings.host_of('spark_master')}:{settings.spark_master_port}"


def master_json_url(settings: StackSettings) -> str:
    return f"http://{settings.host_of('spark_master')}:{settings.spark_master_webui_port}/json/"


def worker_webui_port(settings: StackSettings, number: int) -> int:
    return settings.spark_worker_webui_port + number - 1


def worker_host(settings: StackSettings) -> str:
    """The address a worker registers with (its executors' too): the stack's host, or in a container, which
    listens on every interface, the container's own name (compose resolves it on its network)."""
    return socket.gethostname() if settings.host in _EVERY_INTERFACE else settings.host


def _daemon_env(settings: StackSettings) -> dict[str, str]:
    # spark-class reads SPARK_HOME for the jars and SPARK_CONF_DIR for the logging; a worker passes both to
    # the executors it starts. SPARK_LOCAL_IP keeps them on the stack's host (in a container: every interface).
    env = {"SPARK_HOME": str(spark_home()), "SPARK_CONF_DIR": str(CONF_DIR), "SPARK_DAEMON_MEMORY": DAEMON_HEAP}
    return env if settings.host in _EVERY_INTERFACE else env | {"SPARK_LOCAL_IP": settings.host}


def _spark_class(main: str, args: list[str]) -> list[str]:
    # Through spark-class rather than java: its launcher adds the JVM module options Spark needs on
    # Java 17, for the daemons as for the executors the workers start.
    return [str(spark_home() / "bin" / "spark-class"), main, *args]


def master_command(settings: StackSettings) -> list[str]:
    return _spark_class("org.apache.spark.deploy.master.Master", [
        "--host", settings.host_of("spark_master"), "--port", str(settings.spark_master_port),
        "--webui-port", str(settings.spark_master_webui_port)])


def read_master(settings: StackSettings) -> dict:
    """The master's own view (its web UI's JSON): workers, their cores and memory, the applications."""
    return _read_json(master_json_url(settings), "master")


def _read_json(url: str, what: str) -> dict:
    """A daemon's web UI JSON; Unhealthy naming `what` when it does not answer."""
    try:
        response = httpx.get(url, timeout=HTTP_TIMEOUT_S)
        response.raise_for_status()
        return response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise Unhealthy(f"{what} not answering at {url}: {exc}") from exc


def probe_master(settings: StackSettings) -> str:
    found = read_master(settings)
    if found.get("status") != "ALIVE":
        raise Unhealthy(f"master is {found.get('status')}")
    return f"{found.get('aliveworkers', 0)} workers alive, {found['url']}"


def registered_worker(settings: StackSettings, number: int, workers: list[dict]) -> dict | None:
    """Worker `number`'s record among the master's `workers` (by its web UI's host and port): the live one
    when there is one (a worker started again registers anew, and the master keeps the lost one's record too)."""
    address = f"//{worker_host(settings)}:{worker_webui_port(settings, number)}"
    records = [worker for worker in workers if worker.get("webuiaddress", "").endswith(address)]
    return next((worker for worker in records if worker.get("state") == "ALIVE"), records[0] if records else None)


def alive_worker(settings: StackSettings, number: int) -> dict:
    """The master's record of worker `number`, registered and alive; Unhealthy otherwise."""
    found = registered_worker(settings, number, read_master(settings).get("workers", []))
    if found is None or found.get("state") != "ALIVE":
        raise Unhealthy(f"not registered with the master at {master_url(settings)} yet")
    return found


def worker(number: int) -> Service:
    """Worker `number` (1, 2, ...): its web UI on spark_worker_webui_port + number - 1, its own work folder
    (executors' logs and fetched files), the cores and memory the settings give each worker."""

    def command(settings: StackSettings) -> list[str]:
        work = settings.state_dir / "spark" / f"worker-{number}"
        work.mkdir(parents=True, exist_ok=True)
        return _spark_class("org.apache.spark.deploy.worker.Worker", [
            "--host", worker_host(settings), "--webui-port", str(worker_webui_port(settings, number)),
            "--cores", str(settings.spark_worker_cores), "--memory", settings.spark_worker_memory,
            "--work-dir", str(work), master_url(settings)])

    def probe(settings: StackSettings) -> str:
        found = alive_worker(settings, number)
        return f"{found['cores']} cores, {found['memory']} MB, {found['coresused']} cores used"

    return Service(name=f"{WORKER_PREFIX}{number}", port_fields=(), command=command, probe=probe,
                   after=(MASTER,), env=_daemon_env)


MASTER_SERVICE = Service(
    name=MASTER,
    port_fields=("spark_master_port", "spark_master_webui_port"),
    command=master_command,
    probe=probe_master,
    env=_daemon_env,
)


# The Docker route's worker: one service that `docker-compose up --scale spark-worker=N` runs N times, each
# in a container of its own (so the same ports), told apart by the container's name.
SCALED_WORKER = replace(worker(1), name="spark-worker")


def members(settings: StackSettings, workers: int | None = None) -> list[Service]:
    """The cluster's processes: the master and `workers` workers (by default as many as the profile
    asks for; none without it)."""
    count = settings.spark_workers if workers is None else workers
    return [MASTER_SERVICE, *(worker(number) for number in range(1, count + 1))] if count else []


def worker_number(service: Service) -> int:
    """The number of a worker's service (spark-worker-2: 2)."""
    return int(service.name.removeprefix(WORKER_PREFIX))


def read_worker(settings: StackSettings, number: int) -> dict:
    """Worker `number`'s own view (its web UI's JSON): its cores and memory, the executors it runs."""
    return _read_json(f"http://{worker_host(settings)}:{worker_webui_port(settings, number)}/json/", f"worker {number}")
