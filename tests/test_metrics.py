"""Metrics (issue 12): the library's counts agree with what moved, the /metrics page parses with
prometheus-client's own parser, and a real job's daemons serve figures that agree with the job.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorwire as tw
from tensorwire import metrics
from tensorwire.top import scrape

from .conftest import bad_inputs, free_port
from .jobs import Job, ok

prometheus_client = pytest.importorskip("prometheus_client")


@pytest.fixture(autouse=True)
def fresh_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counts of this test alone: the process's table, which earlier tests filled with other
    tensor names (past the label limit), is set aside meanwhile."""
    monkeypatch.setattr(metrics, "_LEDGER", metrics._Ledger())


def _unique(prefix: str) -> str:
    # the counts are per process and per tensor name: each test counts its own names
    return f"{prefix}-{secrets.token_hex(4)}"


def _traffic(direction: str, tensor: str) -> metrics.Traffic:
    rows = [t for (name, _), t in metrics._LEDGER.traffic[direction].items() if name == tensor]
    assert len(rows) == 1, (direction, tensor, rows)
    return rows[0]


def test_every_message_is_counted_once_each_way(transport: str) -> None:
    """write, write_many and buffer() each count their messages and bytes at the sender; wait()
    counts them at the receiver, labelled with the tensor and the claim's transport."""
    static, dynamic = _unique("static"), _unique("dynamic")
    with tw.Receiver() as rx:
        rx.register(static, (64,), "float32")
        rx.register(dynamic, (None,), "int16", max_bytes=4096)
        with tw.Sender.connect(rx.address, transport=transport, timeout=20) as tx:
            sizes = [3, 100, 0, 2048]
            for k in range(10):
                tx.write(static, np.full(64, k, np.float32))
                rx.wait(static, timeout=10)
                rx.release(static)
            for n in sizes:
                tx.write_many([(dynamic, np.ones(n, np.int16)), (static, np.zeros(64, np.float32))])
                for name in (dynamic, static):
                    rx.wait(name, timeout=10)
                    rx.release(name)
            with tx.buffer(static) as out:
                out[...] = 7
            assert rx.wait(static, timeout=10)[0] == 7
            rx.release(static)
            used = tx.transport_of()
    for direction in ("sent", "received"):
        s, d = _traffic(direction, static), _traffic(direction, dynamic)
        assert (s.messages, s.bytes) == (10 + len(sizes) + 1, (10 + len(sizes) + 1) * 256)
        assert (d.messages, d.bytes) == (len(sizes), 2 * sum(sizes))
    by_label = {key: t for key, t in metrics._LEDGER.traffic["received"].items()}
    assert (static, used) in by_label and (dynamic, used) in by_label


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_full_ring_counts_a_credit_wait(transport: str) -> None:
    """A write that finds every slot held waits for the consumer's release, and says so."""
    name = _unique("full")
    with tw.Receiver(ring=1) as rx:
        rx.register(name, (16,), "float32")
        with tw.Sender.connect(rx.address, transport=transport, timeout=20) as tx:
            tx.write(name, np.ones(16, np.float32))
            rx.wait(name, timeout=10)  # held: the only slot
            releaser = threading.Timer(0.3, rx.release, (name,))
            releaser.start()
            try:
                tx.write(name, np.ones(16, np.float32))  # waits for that release
            finally:
                releaser.join()
            rx.wait(name, timeout=10)
            rx.release(name)
    t = _traffic("sent", name)
    assert t.messages == 2 and t.waits == 1
    assert 0.1 < t.wait_seconds < 20  # it waited about 0.3 s for the release


def test_the_metrics_page_serves_what_the_library_counts() -> None:
    name = _unique("page")
    server = metrics.serve(0, "127.0.0.1")
    try:
        with tw.Receiver() as rx:
            rx.register(name, (8,), "float64")
            with tw.Sender.connect(rx.address, transport="tcp", timeout=20) as tx:
                for _ in range(3):
                    tx.write(name, np.ones(8))
                rx.wait(name, timeout=10)  # one held, two landed and not taken yet
                page = scrape(server.url, timeout=10)
                labels = (("tensor", name), ("transport", "tcp"))
                assert page["tensorwire_sent_messages_total"][labels] == 3
                assert page["tensorwire_sent_bytes_total"][labels] == 3 * 64
                assert page["tensorwire_received_messages_total"][labels] == 1
                assert page["tensorwire_slots_held"][(("tensor", name),)] == 1
                assert page["tensorwire_peers"][(("role", "receiver"),)] >= 1
                assert page["tensorwire_peers"][(("role", "sender"),)] >= 1
                rx.release(name)
                for _ in range(2):
                    rx.wait(name, timeout=10)
                    rx.release(name)
                page = scrape(server.url, timeout=10)
                assert page["tensorwire_received_messages_total"][labels] == 3
                assert page["tensorwire_slots_held"][(("tensor", name),)] == 0
                assert "process_cpu_seconds_total" in page  # prometheus-client's own, alongside
    finally:
        server.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(server.url, timeout=2)


def test_a_port_in_use_is_a_one_line_error() -> None:
    first = metrics.serve(0, "127.0.0.1")
    try:
        with pytest.raises(
            tw.TensorWireError, match=f"cannot serve metrics on 127.0.0.1:{first.port}"
        ):
            metrics.serve(first.port, "127.0.0.1")
    finally:
        first.close()


def test_tensor_labels_are_bounded() -> None:
    """Past MAX_TENSOR_LABELS names, further tensors count together under _other."""
    prefix = _unique("many")
    table = metrics._LEDGER.traffic["sent"]
    room = metrics.MAX_TENSOR_LABELS - len({t for t, _ in table})
    made = [metrics.traffic("sent", f"{prefix}-{k}", "tcp") for k in range(max(room, 0) + 3)]
    names = {t for t, _ in table}
    assert len(names) <= metrics.MAX_TENSOR_LABELS + 1 and metrics.OTHER in names
    assert made[-1] is made[-2] is metrics.traffic("sent", metrics.OTHER, "tcp")


def test_a_counter_is_read_by_its_labels_or_summed() -> None:
    """metrics.counter: one sample by its labels, all summed without, 0 before any count; a
    gauge is not a counter."""
    name = "tensorwire_peers_lost_total"
    assert metrics.counter(name) == 0.0 and metrics.counter(name, "sender") == 0.0
    for role in ("sender", "sender", "receiver"):
        metrics.count(name, role)
    assert metrics.counter(name, "sender") == 2.0
    assert metrics.counter(name, "receiver") == 1.0
    assert metrics.counter(name) == 3.0
    assert metrics.counter("tensorwire_no_such_thing_total") == 0.0
    with pytest.raises(TypeError, match="tensorwire_peers is a gauge"):
        metrics.counter("tensorwire_peers")


def _samples(page: dict[str, Any], name: str) -> dict[Any, float]:
    return page.get(name, {})


def test_a_job_serves_metrics_that_agree_with_it(job: Any, tmp_path: Path) -> None:
    """A real job (one server, two workers, each with --metrics-port): scraped while it runs,
    the counters only grow; at the end, what the server received is what the workers sent and
    the other way round, and its steps are the job's. The server logs JSON lines."""
    ps_port = free_port()
    steps = 1500
    j: Job = job(
        ps=["--steps", str(steps), "--metrics-port", str(ps_port), "--log-format", "json"],
        worker=["--metrics-port", "0"],  # a free port each, which its log names
    )
    url = f"http://127.0.0.1:{ps_port}/metrics"
    worker_url = ""
    scrapes: list[dict[str, Any]] = []
    worker_scrapes: list[dict[str, Any]] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and len(scrapes) < 200:
        if j.ps[0].poll() is not None:
            break
        found = re.search(r"metrics at (http://\S+/metrics)", j.log("w0"))
        worker_url = found.group(1) if found else ""
        try:
            scrapes.append(scrape(url, timeout=10))
            if worker_url:
                worker_scrapes.append(scrape(worker_url, timeout=10))
        except (urllib.error.URLError, ConnectionError):
            pass  # not serving yet, or just finished
        time.sleep(0.05)
    ok(j)
    running = [s for s in scrapes if _samples(s, "tensorwire_ps_steps_total")]
    assert len(running) >= 2, f"{len(scrapes)} scrapes, none while the job ran"
    for name in (
        "tensorwire_ps_steps_total",
        "tensorwire_received_messages_total",
        "tensorwire_sent_bytes_total",
        "tensorwire_ps_gradient_wait_seconds_total",
    ):
        series = [sum(_samples(s, name).values()) for s in running]
        assert series == sorted(series), (name, series)  # monotonic
    last = running[-1]
    assert 0 < sum(_samples(last, "tensorwire_ps_steps_total").values()) <= steps
    assert set(_samples(last, "tensorwire_ps_gradient_wait_seconds_total")) == {
        (("shard", "0"), ("worker", "0")),
        (("shard", "0"), ("worker", "1")),
    }
    assert _samples(last, "tensorwire_ps_workers")[(("shard", "0"),)] == 2
    serves = _samples(last, "tensorwire_ps_serve_seconds_count")[(("shard", "0"),)]
    assert 0 < serves <= steps + 1  # a round each step (and the first parameters)
    assert _samples(last, "tensorwire_ps_serve_seconds_sum")[(("shard", "0"),)] > 0
    ps, workers = j.metrics("ps0"), [j.metrics("w0"), j.metrics("w1")]
    assert ps["steps"] == steps
    assert ps["serve_s"] > 0
    sent = sum(w["traffic"]["sent_messages"] for w in workers)
    assert ps["traffic"]["received_messages"] == sent > 2 * steps
    assert ps["traffic"]["sent_messages"] == sum(w["traffic"]["received_messages"] for w in workers)
    assert ps["traffic"]["received_bytes"] == sum(w["traffic"]["sent_bytes"] for w in workers)
    records = [json.loads(line) for line in j.log("ps0").splitlines() if line.startswith("{")]
    assert any("metrics at http://127.0.0.1:" in r["message"] for r in records)
    assert all({"time", "level", "daemon", "logger", "message"} <= set(r) for r in records)
    assert any(r["message"].startswith("worker 1 joined") for r in records)
    running = [s for s in worker_scrapes if _samples(s, "tensorwire_worker_steps_total")]
    assert running, "the worker's metrics were never scraped while it ran"
    series = [_samples(s, "tensorwire_worker_steps_total")[(("rank", "0"),)] for s in running]
    assert series == sorted(series) and 0 < series[-1] <= steps
    phases = {
        dict(k)["phase"] for k in _samples(running[-1], "tensorwire_worker_phase_seconds_total")
    }
    assert phases == {"compute", "evaluate", "wait", "pull", "push"}


def test_top_shows_a_live_job(job: Any) -> None:
    """`tensorwire top` against a running server and a port nobody serves: a table per refresh,
    with the server's step, steps/s and traffic, and the other endpoint marked unreachable."""
    ps_port, nobody = free_port(), free_port()
    j: Job = job(ps=["--steps", "6000", "--metrics-port", str(ps_port)])
    url = f"http://127.0.0.1:{ps_port}/metrics"
    for _ in range(600):  # bounded: until the job is training (a step counted, not only 0)
        try:
            if any(
                v > 0
                for v in _samples(scrape(url, timeout=10), "tensorwire_ps_steps_total").values()
            ):
                break
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.05)
    top = _top(
        f"127.0.0.1:{ps_port}",
        f"http://127.0.0.1:{nobody}/metrics",
        *("--interval", "0.5", "--count", "2"),
    )
    j.kill()
    assert top.returncode == 0, top.stderr
    frames = top.stdout.split("tensorwire top")
    assert len(frames) == 3, top.stdout  # two tables (and what precedes the first)
    ps_rows = [line for line in top.stdout.splitlines() if f"ps0 127.0.0.1:{ps_port}" in line]
    assert len(ps_rows) == 2, top.stdout
    cells = [c.strip() for c in ps_rows[-1].split("│")]
    step, rate = int(cells[2]), float(cells[3])
    assert 0 < step <= 6000 and rate > 0, ps_rows
    assert "tcp" in ps_rows[-1] or "shm" in ps_rows[-1]  # bytes/s per transport
    assert top.stdout.count("unreachable") == 2


def _top(*args: str) -> subprocess.CompletedProcess[str]:
    """``tensorwire top`` with ``args``, run to its end (give ``--count``)."""
    return subprocess.run(
        [sys.executable, "-m", "tensorwire", "top", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_top_shows_the_checkpoints_a_server_could_not_write() -> None:
    """A server whose checkpoints fail trains on (its log says so once per checkpoint): the
    live view puts the count beside its step, where an operator looks; so too the steps a
    shard clipped by its own norm, no worker having given it the sum of the shards' (bsp,
    --clip-grad-norm over several shards: it clipped less than it should have)."""
    from tensorwire.top import Target, row

    t = Target("http://127.0.0.1:9100/metrics")
    shard = (("shard", "0"),)
    t.page = {
        "tensorwire_ps_step": {shard: 1200.0},
        "tensorwire_ps_checkpoint_failures_total": {shard: 3.0},
    }
    assert row(t)[1] == "1200 (3 checkpoints failed)"
    t.page["tensorwire_ps_checkpoint_failures_total"] = {shard: 0.0}
    assert row(t)[1] == "1200"
    t.page["tensorwire_ps_done"] = {shard: 1.0}  # (a server that lingers once its job is done)
    assert row(t)[1] == "1200 (done)"
    t.page["tensorwire_ps_clipped_alone_steps_total"] = {shard: 2.0}
    assert row(t)[1] == "1200 (2 steps clipped by its own norm) (done)"


def test_top_exits_1_when_no_endpoint_answers() -> None:
    """Before, `top --count 1` exited 0 with every endpoint unreachable: a script could not
    tell a live job from a dead one."""
    top = _top(f"127.0.0.1:{free_port()}", "--count", "1")
    assert top.returncode == 1 and "unreachable" in top.stdout
    assert top.stderr.strip() == "tensorwire top: no endpoint answered at the last refresh"


def test_top_pointed_at_a_daemons_control_port_says_to_give_its_metrics_port() -> None:
    """A daemon's --bind port given for its --metrics-port: the HTTP client read ZeroMQ's
    greeting as "timed out", or raised http.client's BadStatusLine, which `top` did not catch
    (a test's scrape met it). It now names the mistake."""
    from tensorwire.top import Target

    with tw.Receiver(bind="tcp://127.0.0.1:0") as rx:
        port = rx.address.rsplit(":", 1)[1]
        target = Target(f"http://127.0.0.1:{port}/metrics")
        target.refresh(timeout=1.0)
    assert target.error.startswith("unreachable: a tensorwire control plane (ZeroMQ)"), target
    assert "give the daemon's --metrics-port" in target.error and not target.page


def test_a_metrics_host_without_a_port_is_warned_of() -> None:
    """--metrics-host alone served nothing, without a word (the port was forgotten)."""
    out = subprocess.run(
        [
            *(sys.executable, "-m", "tensorwire.client.worker", "--no-progress"),
            *("--servers", f"tcp://127.0.0.1:{free_port()}", "--connect-timeout", "0.3"),
            *("--metrics-host", "127.0.0.1"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 1, out.stderr  # (no server: it ran, and said so first)
    assert "--metrics-host 127.0.0.1 without --metrics-port serves no metrics" in out.stderr


def test_top_refuses_what_is_not_a_metrics_address() -> None:
    """Each in one line, before a scrape: a port out of range (or not a number) ended `top`
    with a traceback from its first refresh."""
    for endpoint, says in (
        ("ftp://host/metrics", "is not an http address"),
        ("127.0.0.1:99999", "is not HOST:PORT with a port of 1-65535"),
        ("127.0.0.1:metrics", "is not HOST:PORT with a port of 1-65535"),
        ("http://:9100/metrics", "is not HOST:PORT"),
        ("127.0.0.1", "is not HOST:PORT"),  # (an http:// URL may leave its port to http's)
        ("::1:9100", "an IPv6 address goes in brackets"),
    ):
        top = _top(endpoint, "--count", "1")
        assert top.returncode == 2 and "Traceback" not in top.stderr, top.stderr
        assert says in top.stderr.strip().splitlines()[-1], top.stderr
    assert _top("[::1]:1", "--count", "1").returncode == 1  # an address, where nothing answers


@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_bench_serve_serves_metrics_and_logs_json(tmp_path: Path, stop: str) -> None:
    """`tensorwire bench serve --metrics-port`: the library's metrics are scrapable while it
    waits for a runner; its log lines are JSON; Ctrl-C (or SIGTERM) ends it cleanly, also
    right after it started (the signal is sent as soon as the metrics answer)."""
    import signal

    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorwire",
            "bench",
            "serve",
            "--bind",
            f"tcp://127.0.0.1:{free_port()}",
            "--metrics-port",
            str(port),
            "--log-format",
            "json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        page: dict[str, Any] = {}
        for _ in range(200):  # bounded: until it serves
            try:
                page = scrape(f"http://127.0.0.1:{port}/metrics", timeout=10)
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.05)
        assert "process_cpu_seconds_total" in page
        proc.send_signal(getattr(signal, stop))
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    record = json.loads(err.splitlines()[0])
    assert record["daemon"] == "bench-serve" and record["message"].startswith("metrics at ")
    assert "serving on" in out


def test_grpc_calls_with_forged_tokens_are_refused_and_bad_inputs() -> None:
    """Anyone reaching the gRPC data port can call it: each call with a token the receiver never
    issued is refused and counted, and nothing lands."""
    grpc = pytest.importorskip("grpc")
    from tensorwire.transports import tensor_service_pb2 as pb
    from tensorwire.transports import tensor_service_pb2_grpc as pb_grpc

    with tw.Receiver(grpc=True) as rx:
        rx.register("t", (4,), "float32")
        port = rx._servers["grpc"].port
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.TensorServiceStub(channel)
            for _ in range(3):
                with pytest.raises(grpc.RpcError) as opened:
                    stub.Open(pb.OpenRequest(token=secrets.token_bytes(16)), timeout=10)
                assert opened.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                with pytest.raises(grpc.RpcError) as wrote:
                    stub.Write(pb.TensorProto(token=secrets.token_bytes(16)), timeout=10)
                assert wrote.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert rx.pending("t") == 0
    assert bad_inputs() == {"grpc_opens_refused": 3, "grpc_calls_with_unknown_tokens": 3}


def test_top_shows_no_loss_before_the_first_step(tmp_path: Path) -> None:
    """A server waiting for its workers exports its loss as NaN (no step yet): `tensorwire top`
    shows "-" there, as for every other value it does not have, not "nan". Its learning rate
    at step 0 of a warmup is 0."""
    from .jobs import Processes

    port = free_port()
    procs = Processes(tmp_path)
    try:
        ps = ["ps", "--bind", f"tcp://127.0.0.1:{free_port()}", "--workers", "2"]
        ps += ["--metrics-port", str(port), "--no-progress", "--warmup-steps", "10"]
        procs.start([sys.executable, "-m", "tensorwire", *ps], log="ps")
        url = f"http://127.0.0.1:{port}/metrics"
        for _ in range(600):  # bounded: until it serves its metrics
            try:
                loss = _samples(scrape(url, timeout=10), "tensorwire_ps_loss")
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.05)
        assert all(v != v for v in loss.values()), loss  # NaN: no step yet
        rate = _samples(scrape(url, timeout=10), "tensorwire_ps_learning_rate")
        assert list(rate.values()) == [0.0], rate  # (the warmup's first step)
        top = _top(f"127.0.0.1:{port}", "--count", "1")
        assert top.returncode == 0, top.stderr
        row = next(line for line in top.stdout.splitlines() if f"ps0 127.0.0.1:{port}" in line)
        cells = [c.strip() for c in row.split("│")]
        assert cells[4] == "-" and "nan" not in row, row
    finally:
        procs.kill()
