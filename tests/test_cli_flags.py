"""The command line as a newcomer meets it: a host name where an address was expected, a
zero or a typo in a flag, a start-up that cannot succeed. Each gets either a working broker or
one clear message, never a silent fallback or the same error twice."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request

from conftest import free_port, kaas_bin
from kcheck import create_topic, rdkafka_produce, rdkafka_read_all, unique_topic


def run_kaas(tmp_path, *flags, timeout=30):
    return subprocess.run([str(kaas_bin()), "--data-dir", str(tmp_path / "data"), *flags],
                          env={**os.environ, "NO_COLOR": "1"}, capture_output=True, text=True,
                          timeout=timeout)


def test_listen_takes_a_host_name(tmp_path):
    """`--listen localhost:PORT` (what Kafka's `listeners` accepts) serves clients that
    bootstrap from `localhost`; it was refused as "invalid socket address syntax"."""
    port, health = free_port(), free_port()
    proc = subprocess.Popen([str(kaas_bin()), "--listen", f"localhost:{port}", "--data-dir",
                             str(tmp_path / "data"), "--health-listen", f"localhost:{health}",
                             "--shards", "1"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=1):
                    break
            except OSError:
                time.sleep(0.1)
        else:
            raise AssertionError("not ready within 30 s")
        bootstrap = f"localhost:{port}"
        topic = unique_topic("named")
        create_topic(bootstrap, topic, 1)
        rdkafka_produce(bootstrap, topic, ((b"k%d" % i, b"v%d" % i) for i in range(10)))
        records, _ = rdkafka_read_all(bootstrap, topic, 1)
        assert [r[3] for r in records] == [b"v%d" % i for i in range(10)]
    finally:
        proc.terminate()
        proc.wait(30)


def test_bad_flags_are_refused_with_the_reason(tmp_path):
    """A flag that cannot work is refused before anything starts (exit 2, the flag named), not
    replaced by a default: `--shards 0` ran one shard, a malformed `--log` logged at info."""
    cases = [
        (["--shards", "0"], "--shards"),
        (["--shards", "many"], "--shards"),
        (["--log", "kaas_shard=loud"], "--log"),
        (["--listen", "localhost:port"], "--listen"),
        (["--health-listen", "127.0.0.1"], "--health-listen"),
    ]
    for flags, named in cases:
        r = run_kaas(tmp_path, *flags)
        assert r.returncode == 2 and named in r.stderr, (flags, r.returncode, r.stderr)
    assert not (tmp_path / "data").exists(), "nothing was started or written"


def test_a_failed_start_says_why_once(tmp_path):
    """A start that cannot succeed (the data directory is a file) exits 1 and prints its
    reason once; it was printed twice, through the log and again plainly."""
    (tmp_path / "data").write_text("not a directory")
    r = run_kaas(tmp_path, "--listen", f"127.0.0.1:{free_port()}",
                 "--health-listen", f"127.0.0.1:{free_port()}")
    assert r.returncode == 1, (r.returncode, r.stderr)
    lines = [line for line in r.stderr.splitlines() if "failed to start" in line]
    assert len(lines) == 1, r.stderr
    assert "data" in lines[0], lines
