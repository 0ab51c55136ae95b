"""conftest.py for kafka-python's own `test/integration` suite run against an existing broker.

tests/suites/kafka_python.py copies this file to `test/conftest.py` of the extracted
kafka-python sdist (the sdist has no `test/conftest.py` of its own).

The sdist ships the integration fixtures (`test/integration/conftest.py`, `fixtures.py`:
kafka_broker, kafka_broker_factory, topic, producer, consumer, kafka_consumer_factory,
kafka_producer_factory, kafka_admin_client(_factory), kafka_client, consumer_group,
send_messages), and they already know how to use a running broker instead of starting one:
`KAFKA_URI=PLAINTEXT://host:port`. They are left in charge. What the sdist lacks, and this
file supplies, is:

* `test.service` (upstream's `test/service.py`, imported by fixtures.py): `ExternalService`
  as upstream has it; `SpawnedService` refuses, because the suite never starts a Kafka.
* the `servers/<version>/kafka-bin` tree that `Fixture.__init__` insists on: not needed for
  an external broker, so the check is dropped. A fixture that would spawn its own broker
  (the SSL tests' `ssl_kafka`) is skipped instead: kaas has no TLS listener, and the suite
  has no Kafka distribution to start.
* `KAFKA_URI` from `KAAS_SUITE_BOOTSTRAP=host:port` when only the latter is set, and a
  default `KAFKA_VERSION` (see kafka_python.py for the version chosen and why).

Setting KAFKA_URI also makes upstream skip `test_sasl_integration.py` (its own
`pytestmark`: "Testing on external Kafka Broker").

Two changes to the client under test (kafka_python_client_fixes.py, copied here as
`test/kaas_client_fixes.py`): a lost metadata update in ClusterMetadata, which failed a random
consumer test in about 40 % of suite runs, and a rebalance that poll()'s timeout leaves
unfinished for good, which stalled test_describe_group_exists in a CI run on a cluster. Both
stall the client whatever the broker answers (the second reproduced against Kafka 4.4 too).
KAAS_KAFKA_PYTHON_RAW_CLIENT=1 runs the client unchanged.
"""

from __future__ import annotations

import logging
import os
import sys
import types

import pytest

if not os.environ.get("KAFKA_URI"):
    bootstrap = os.environ.get("KAAS_SUITE_BOOTSTRAP")
    if not bootstrap:
        raise pytest.UsageError("set KAAS_SUITE_BOOTSTRAP=host:port (or KAFKA_URI) to the broker"
                                " under test")
    os.environ["KAFKA_URI"] = f"PLAINTEXT://{bootstrap}"
os.environ.setdefault("KAFKA_VERSION", "4.2.0")

log = logging.getLogger("test.service")


class ExternalService:
    """A service someone else runs (as upstream's test/service.py)."""

    def __init__(self, host, port):
        log.info("Using already running service at %s:%d", host, port)
        self.host = host
        self.port = port

    def open(self):
        pass

    def close(self):
        pass

    def dump_logs(self):
        pass


class SpawnedService:
    def __init__(self, *args, **kwargs):
        pytest.skip("kaas suite: starts its own Kafka process (no Kafka distribution here)")


_service = types.ModuleType("test.service")
_service.__doc__ = "stand-in for kafka-python's test/service.py (not in the sdist)"
_service.ExternalService = ExternalService
_service.SpawnedService = SpawnedService
_service.__all__ = ["ExternalService", "SpawnedService"]
sys.modules["test.service"] = _service

from test.integration import fixtures as _fixtures  # noqa: E402  (needs test.service)


def _fixture_init(self):
    # upstream: `if not os.path.isdir(self.kafka_root): raise FileNotFoundError(...)`
    self.child = None


_fixtures.Fixture.__init__ = _fixture_init

_upstream_kafka_open = _fixtures.KafkaFixture.open


def _kafka_open(self):
    if not self.external:
        pytest.skip(f"kaas suite: needs a {self.transport} Kafka broker the test starts itself"
                    " (kaas serves PLAINTEXT only; no Kafka distribution here)")
    return _upstream_kafka_open(self)


_fixtures.KafkaFixture.open = _kafka_open


def _zookeeper_open(self):
    if not self.running:
        pytest.skip("kaas suite: needs a ZooKeeper the test starts itself")


_fixtures.ZookeeperFixture.open = _zookeeper_open


# -- kafka-python 3.0.12 client races ------------------------------------------------------------
# test/kaas_client_fixes.py is tests/suites/kafka_python_client_fixes.py, copied next to this file
# by tests/suites/kafka_python.py; its docstring and comments say what each fix closes and why.
if os.environ.get("KAAS_KAFKA_PYTHON_RAW_CLIENT", "") in ("", "0"):
    from test import kaas_client_fixes

    kaas_client_fixes.apply()


def pytest_report_header(config):
    return (f"kafka-python integration suite against {os.environ['KAFKA_URI']}"
            f" (KAFKA_VERSION={os.environ['KAFKA_VERSION']})")
