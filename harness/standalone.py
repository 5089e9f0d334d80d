"""Apache Pulsar standalone for tests and benchmarks: broker + bookie + RocksDB metadata store in one JVM.

:class:`PulsarStandalone` is a :class:`pulsar_nack.testing.Broker` (the same life cycle as the embedded
pulsar-lite): Java 17+ and, the first time, Maven (see :mod:`harness.maven`); its admin REST client is
:meth:`PulsarStandalone.admin`. :func:`start_broker` starts either broker by kind::

    from harness.standalone import start_broker

    with start_broker("apache") as broker:          # or "lite"
        client = pulsar.Client(broker.service_url)
        ...
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from harness.maven import (
    APACHE_PULSAR_VERSION,
    STANDALONE_MAIN,
    default_maven_project,
    java_available,
    java_binary,
    resolve_classpath,
)
from pulsar_nack.testing import (
    LOOPBACK,
    Broker,
    BrokerError,
    PulsarLite,
    SettingValue,
    free_ports,
    port_accepts,
)

__all__ = ["PulsarStandalone", "start_broker"]

def _loopback_interface() -> str:
    """Name of the loopback network interface (``lo`` on Linux)."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return "lo"
    if "lo" in names:
        return "lo"
    return next((n for n in names if n.startswith("lo")), "lo")


# ---------------------------------------------------------------------------------------------
# Java / Maven discovery


_JVM_MODULE_OPTIONS = (
    # What Pulsar's own bin/pulsar passes on Java 17 (netty, metrics, checksums).
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/java.util.zip=ALL-UNNAMED",
    "--add-opens=java.base/sun.net=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.platform=ALL-UNNAMED",
    "--add-opens=java.management/sun.management=ALL-UNNAMED",
    "--add-opens=jdk.management/com.sun.management.internal=ALL-UNNAMED",
)

_LOG4J2_XML = """<?xml version="1.0" encoding="UTF-8"?>
<!-- written by harness.standalone.PulsarStandalone: everything to stdout (the broker log file) -->
<Configuration status="warn">
  <Appenders>
    <Console name="stdout" target="SYSTEM_OUT">
      <PatternLayout pattern="%d{{ISO8601}} %-5p [%t] %c{{1}} - %m%n"/>
    </Console>
  </Appenders>
  <Loggers>
    <Root level="{level}"><AppenderRef ref="stdout"/></Root>
  </Loggers>
</Configuration>
"""


#: Setting names that look right but that Pulsar ignores silently -> the real name.
_MISNAMED_SETTINGS = {
    "delayedDeliveryMaxDeliveryDelayInMillis": "delayedDeliveryMaxDelayInMillis",  # PIP-315
    "delayedDeliveryDeliverAtTimeStrict": "isDelayedDeliveryDeliverAtTimeStrict",
    "maxDeliveryDelayInMillis": "delayedDeliveryMaxDelayInMillis",
}


class PulsarStandalone(Broker):
    """Apache Pulsar standalone: broker + bookie + RocksDB metadata store in one JVM.

    Runs ``java -cp <classpath> io.github.pulsarnack.standalone.StandaloneMain --config FILE
    --no-functions-worker --no-stream-storage ...`` directly (the PID is the JVM's; that main
    class expires ephemeral metadata a SIGKILLed run left behind -- with Pulsar's RocksDB metadata
    store they otherwise make the bookie's registration flap after :meth:`kill` -- and then calls
    ``org.apache.pulsar.PulsarStandaloneStarter``), with a
    config written here: broker, web service and bookie on 127.0.0.1 free ports,
    ``acknowledgmentAtBatchIndexLevelEnabled=true``, ``delayedDeliveryEnabled=true`` with strict
    delivery times on a 100 ms tick, single-bookie ledgers, plus the caller's ``settings`` (which
    win; a few look-alike names Pulsar would ignore silently are rejected).

    PIP-315: the limit is ``delayedDeliveryMaxDelayInMillis``. With pulsar-client 3.13 a send whose
    ``deliver_after`` exceeds it never completes (the broker drops the connection, the client
    reconnects and resends), so keep test delays under the limit.

    The classpath comes from the Maven project ``harness/broker/`` (``org.apache.pulsar:pulsar-broker``
    :data:`~harness.maven.APACHE_PULSAR_VERSION`), resolved once into ``~/.m2`` and cached in
    ``harness/broker/target/classpath.txt``.
    """

    kind = "apache"
    log_name = "broker.log"
    main_class: ClassVar[str] = STANDALONE_MAIN

    def __init__(
        self,
        *,
        settings: Mapping[str, SettingValue] | None = None,
        heap_mb: int = 1024,
        direct_memory_mb: int = 1024,
        c1_only: bool = True,
        jvm_options: Sequence[str] = (),
        log_level: str = "info",
        maven_project: str | os.PathLike[str] | None = None,
        maven_timeout: float = 1200.0,
        cluster_name: str = "standalone",
        data_dir: str | os.PathLike[str] | None = None,
        start_timeout: float = 120.0,
        stop_timeout: float = 30.0,
        keep_data_dir: bool | None = None,
        die_with_parent: bool = True,
    ) -> None:
        """Create (but do not start) an Apache Pulsar standalone.

        Args:
            settings: extra broker/bookie settings for the config file, e.g.
                ``{"delayedDeliveryMaxDelayInMillis": 60000}``; they override the
                harness defaults (but ports and bind addresses stay on loopback).
            heap_mb: -Xms/-Xmx of the JVM.
            direct_memory_mb: -XX:MaxDirectMemorySize (netty buffers, managed-ledger cache).
            c1_only: -XX:TieredStopAtLevel=1: starts ~40% faster on 2 cores; turn off for
                throughput benchmarks.
            jvm_options: further JVM options, appended last (so they win).
            log_level: log4j2 root level of the broker log.
            maven_project: the Maven project (default: ``$PULSAR_NACK_BROKER_PROJECT``, else
                ``harness/broker/``).
            maven_timeout: seconds allowed for the one-time Maven resolution.
            cluster_name: Pulsar cluster name.
            data_dir, start_timeout, stop_timeout, keep_data_dir, die_with_parent: see
                :class:`Broker`.
        """
        super().__init__(
            data_dir=data_dir,
            start_timeout=start_timeout,
            stop_timeout=stop_timeout,
            keep_data_dir=keep_data_dir,
            die_with_parent=die_with_parent,
        )
        self.settings = dict(settings or {})
        for key in self.settings:
            if key in _MISNAMED_SETTINGS:
                raise ValueError(
                    f"Pulsar {APACHE_PULSAR_VERSION} has no setting {key!r} (it would be ignored "
                    f"silently): use {_MISNAMED_SETTINGS[key]!r}"
                )
        self.heap_mb = heap_mb
        self.direct_memory_mb = direct_memory_mb
        self.c1_only = c1_only
        self.jvm_options = list(jvm_options)
        self.log_level = log_level
        self.maven_project = (
            Path(maven_project).resolve() if maven_project is not None else default_maven_project()
        )
        self.maven_timeout = maven_timeout
        self.cluster_name = cluster_name
        self.port, self.web_port, self.bookie_port = free_ports(3)
        self._classpath: str | None = None

    # -- addresses -------------------------------------------------------------------------------

    @property
    def service_url(self) -> str:
        """``pulsar://127.0.0.1:PORT``."""
        return f"pulsar://{LOOPBACK}:{self.port}"

    @property
    def web_service_url(self) -> str:
        """``http://127.0.0.1:WEBPORT`` (admin REST API and /metrics)."""
        return f"http://{LOOPBACK}:{self.web_port}"

    @property
    def admin_url(self) -> str:
        """Same as :attr:`web_service_url`."""
        return self.web_service_url

    @property
    def config_path(self) -> Path:
        """The broker config file written into the data dir."""
        return self.data_dir / "conf" / "standalone.conf"

    # -- admin REST ------------------------------------------------------------------------------

    def admin(self, method: str, path: str, body: Any = None, timeout: float = 30.0) -> Any:
        """Call the admin REST API: ``admin("GET", "/admin/v2/clusters")``.

        ``body`` is sent as JSON. Returns the decoded JSON answer (None for an empty one).

        Raises:
            BrokerError: HTTP error status (with the broker's reason) or connection failure.
        """
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.web_service_url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", errors="replace")
            raise BrokerError(f"{method} {path} -> HTTP {exc.code}: {detail}") from exc
        except OSError as exc:
            raise BrokerError(f"{method} {path} failed: {exc}") from exc
        return json.loads(raw) if raw.strip() else None

    def create_partitioned_topic(self, topic: str, partitions: int) -> None:
        """Create a partitioned topic through ``PUT /admin/v2/{domain}/{tenant}/{ns}/{name}/partitions``.

        ``topic`` is a full name (``persistent://public/default/x``) or a short one (``x``, put
        in ``public/default``).

        Raises:
            BrokerError: e.g. HTTP 409 if the topic already exists.
        """
        if partitions < 1:
            raise ValueError("partitions must be >= 1")
        self.admin("PUT", f"/admin/v2/{_topic_path(topic)}/partitions", partitions)

    # -- Broker hooks ----------------------------------------------------------------------------

    def _settings(self) -> dict[str, SettingValue]:
        """The config file's settings: harness defaults, the caller's, then forced loopback."""
        merged: dict[str, SettingValue] = {
            "clusterName": self.cluster_name,
            # no functions worker, no stream storage (also passed on the command line)
            "functionsWorkerEnabled": False,
            "enablePackagesManagement": False,
            "webSocketServiceEnabled": False,
            "transactionCoordinatorEnabled": False,
            # what this project's tests need
            "acknowledgmentAtBatchIndexLevelEnabled": True,
            "delayedDeliveryEnabled": True,
            # deliver_after/deliver_at to ~0.1 s: by default a delay that ends within the next
            # 1 s tick is delivered at once (non-strict), e.g. deliver_after=1s arrives at 0.03 s
            "isDelayedDeliveryDeliverAtTimeStrict": True,
            "delayedDeliveryTickTimeMillis": 100,
            "allowAutoTopicCreation": True,
            "allowAutoTopicCreationType": "non-partitioned",
            # one bookie
            "managedLedgerDefaultEnsembleSize": 1,
            "managedLedgerDefaultWriteQuorum": 1,
            "managedLedgerDefaultAckQuorum": 1,
            "journalSyncData": False,  # written, not fsynced: survives SIGKILL, not power loss
            "dbStorage_writeCacheMaxSizeMb": 32,
            "dbStorage_readAheadCacheMaxSizeMb": 32,
            "managedLedgerCacheSizeMB": 64,
            # stop in ~3 s instead of ~7 s (netty quiet periods scale with this)
            "brokerShutdownTimeoutMs": 5000,
        }
        merged.update(self.settings)
        merged.update(
            {
                # every listener on loopback, on our ports
                "bindAddress": LOOPBACK,
                "advertisedAddress": LOOPBACK,
                "brokerServicePort": self.port,
                "webServicePort": self.web_port,
                # the bookie reads the same file: bind it to the loopback interface, on our port
                "bookiePort": self.bookie_port,
                "allowEphemeralPorts": True,
                "listeningInterface": _loopback_interface(),
                "allowLoopback": True,
                "httpServerEnabled": False,
            }
        )
        for key in ("brokerServicePortTls", "webServicePortTls", "bindAddresses", "advertisedListeners"):
            merged.pop(key, None)
        return merged

    def _prepare(self) -> None:
        self._classpath = resolve_classpath(self.maven_project, self.maven_timeout)
        conf_dir = self.data_dir / "conf"
        conf_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "tmp").mkdir(exist_ok=True)
        lines = ["# written by harness.standalone.PulsarStandalone"]
        for key, value in self._settings().items():
            if not re.fullmatch(r"[A-Za-z0-9_.\-]+", key):
                raise ValueError(f"unsupported broker setting name {key!r}")
            text = ("true" if value else "false") if isinstance(value, bool) else str(value)
            if "\n" in text or "\r" in text:
                raise ValueError(f"broker setting {key} has a line break")
            lines.append(f"{key}={text.replace(chr(92), chr(92) * 2)}")
        self.config_path.write_text("\n".join(lines) + "\n")
        (conf_dir / "log4j2.xml").write_text(_LOG4J2_XML.format(level=self.log_level.upper()))

    def _command(self) -> list[str]:
        java = java_binary()
        if java is None:
            raise BrokerError(java_available()[1])
        if self._classpath is None:
            self._classpath = resolve_classpath(self.maven_project, self.maven_timeout)
        data = self.data_dir
        jvm = [
            java,
            f"-Xms{self.heap_mb}m",
            f"-Xmx{self.heap_mb}m",
            f"-XX:MaxDirectMemorySize={self.direct_memory_mb}m",
            "-XX:+UseSerialGC",
            "-XX:+ExitOnOutOfMemoryError",
            *(["-XX:TieredStopAtLevel=1"] if self.c1_only else []),
            *_JVM_MODULE_OPTIONS,
            "-Dio.netty.tryReflectionSetAccessible=true",
            "-Djava.net.preferIPv4Stack=true",
            "-Dpulsar.allocator.exit_on_oom=true",
            # RocksDB extracts its native library into java.io.tmpdir: keep it in our data dir
            f"-Djava.io.tmpdir={data / 'tmp'}",
            f"-Dlog4j2.configurationFile={data / 'conf' / 'log4j2.xml'}",
            *self.jvm_options,
        ]
        return [
            *jvm,
            "-cp",
            self._classpath,
            self.main_class,
            "--config",
            str(self.config_path),
            "--no-functions-worker",
            "--no-stream-storage",
            "--advertised-address",
            LOOPBACK,
            "--metadata-dir",
            str(data / "metadata"),
            "--bookkeeper-dir",
            str(data / "bookkeeper"),
            "--bookkeeper-port",
            str(self.bookie_port),
            # must not exist: its presence switches standalone to ZooKeeper mode
            "--zookeeper-dir",
            str(data / "zookeeper"),
        ]

    def _ready(self) -> bool:
        """The admin API answers, lists our cluster and the public/default namespace exists."""
        try:
            clusters = self.admin("GET", "/admin/v2/clusters", timeout=2.0)
            if self.cluster_name not in (clusters or []):
                return False
            namespaces = self.admin("GET", "/admin/v2/namespaces/public", timeout=2.0)
        except BrokerError:
            return False
        return "public/default" in (namespaces or []) and port_accepts(self.port)

    def classpath_digest(self) -> str:
        """Short digest of the resolved classpath (identifies the exact Pulsar build)."""
        cp = self._classpath or resolve_classpath(self.maven_project, self.maven_timeout)
        return hashlib.sha1(cp.encode()).hexdigest()[:12]


def _topic_path(topic: str) -> str:
    """``persistent://t/ns/x`` or ``x`` -> ``persistent/t/ns/x`` (URL-quoted) for the admin API."""
    if "://" in topic:
        domain, rest = topic.split("://", 1)
    else:
        domain, rest = "persistent", topic
    parts = rest.split("/")
    if len(parts) == 1:
        parts = ["public", "default", parts[0]]
    if len(parts) != 3 or not all(parts) or domain not in ("persistent", "non-persistent"):
        raise ValueError(f"not a topic name: {topic!r}")
    return "/".join([domain, *(urllib.parse.quote(p, safe="") for p in parts)])


# ---------------------------------------------------------------------------------------------
# entry point


def start_broker(kind: Literal["lite", "apache"] = "lite", **options: Any) -> Broker:
    """Start a broker and return it (use it as a context manager to stop it).

    ``kind="lite"`` gives a :class:`PulsarLite`, ``kind="apache"`` a :class:`PulsarStandalone`;
    ``options`` go to the class's constructor.
    """
    broker: Broker
    if kind == "lite":
        broker = PulsarLite(**options)
    elif kind == "apache":
        broker = PulsarStandalone(**options)
    else:
        raise ValueError(f"unknown broker kind {kind!r}: use 'lite' or 'apache'")
    return broker.start()


