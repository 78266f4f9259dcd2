"""The serve load benchmark's client: closed loops and paced (open-loop) schedules.

A small keep-alive HTTP server on 127.0.0.1 answers ``/v1/select`` after a fixed delay. A sleep
never ends early, so that delay bounds every latency from below and every rate from above, however
busy the machine: the assertions use those bounds and the schedule's own slot counts, never an
upper bound on how fast this machine happens to be.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from benchmarks.serve_load import in_process, load, method_rates, offered, one_epoch, ranks_once, summary
from workflows.serve import app_args


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the benchmark's clients expect
    disable_nagle_algorithm = True  # headers and body are two writes; Nagle would hold the body 40 ms
    delay_s = 0.0

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(self.delay_s)
        body = json.dumps({"model_version": "test/v0001"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _server(delay_s: float) -> Iterator[str]:
    handler = type("Handler", (_Handler,), {"delay_s": delay_s})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def fast_server() -> Iterator[str]:
    yield from _server(0.0)


@pytest.fixture
def slow_server() -> Iterator[str]:
    yield from _server(0.05)


BODIES = [{"query": "weather in Paris", "top_k": 5}]


def test_paced_load_keeps_the_offered_rate(fast_server: str) -> None:
    m = load([fast_server], BODIES, clients=4, seconds=1.5, rate=80.0)
    assert m["errors"] == 0
    assert m["versions"] == ["test/v0001"]
    # 80 req/s for 1.5 s after the 1 s warm-up: slots 80 to 199, each sent (late or not) and counted
    # (the slot at exactly 2.5 s may round either side of the window's end).
    assert 120 <= m["requests"] <= 121


def test_paced_load_charges_queueing_to_latency(slow_server: str) -> None:
    """One client offered 40 req/s against a 50 ms server can do only 20/s: it falls further
    behind each request, and the latencies (counted from the schedule) show the backlog."""
    m = load([slow_server], BODIES, clients=1, seconds=1.0, rate=40.0)
    assert m["errors"] == 0 and m["requests"] == 40  # the measured slots 40..79, all sent
    # Request k ends 50 ms x (k + 1) after the start at the earliest, its slot is at 25 ms x k: the
    # first measured one (k = 40) is already >= 1,050 ms behind its slot. A closed loop, or latency
    # counted from the send, would say about 50 ms.
    assert m["p50_ms"] >= 1050
    # req/s is what completed inside the 1 s window: the server's 20/s at most, not the offered 40.
    assert m["rps"] <= 21


@pytest.fixture
def slower_server() -> Iterator[str]:
    yield from _server(0.8)


def test_req_s_counts_what_completes_in_the_window_whenever_it_was_sent(slower_server: str) -> None:
    # Four clients, 0.8 s a request, a 1 s warm-up and a 1 s window: each client's request sent at
    # 0.8 s (warm-up) completes at 1.6 s, inside the window (0.4 s to spare); the next ends at 2.4 s.
    # Counting only requests sent inside the window over the time until the last ended read 4 / 1.4.
    m = load([slower_server], BODIES, clients=4, seconds=1.0)
    assert m["errors"] == 0
    assert m["rps"] == pytest.approx(4.0)


def test_closed_loop_is_bounded_by_service_time(slow_server: str) -> None:
    m = load([slow_server], BODIES, clients=2, seconds=1.0)
    assert m["errors"] == 0 and m["requests"] > 0
    assert m["p50_ms"] >= 50  # every answer waits the server's 50 ms
    # Two clients, one request at a time each, >= 50 ms per request: at most 21 each start in the
    # 1 s window.
    assert m["rps"] <= 42


def test_a_method_is_paced_at_its_target_or_below_its_capacity() -> None:
    targets = {"direct ingress": 120.0, "proxy": 60.0}
    rates, capped = method_rates(targets, {"direct ingress": 400.0, "proxy": 50.0})
    # Direct ingress has room for 120 req/s; the proxy's 8-client loop did 50, so 60 would only
    # measure a growing backlog: it is paced at 0.8x what it did, and the row says so.
    assert rates == {"direct ingress": [120.0], "proxy": [40.0]}
    assert capped == {"proxy": 60.0}
    assert offered({"rate": 40.0, "capped_from": 60.0}) == "40 (0.8× capacity; target 60)"
    assert offered({"rate": 120.0}) == "120" and offered({}) == "closed loop"
    # A door that was not measured (direct ingress off) is not paced.
    assert method_rates(targets, {"proxy": 100.0}) == ({"proxy": [60.0]}, {})


def test_one_epoch_cuts_every_stage_and_keeps_the_model() -> None:
    params = {
        "lm": {"num_layers": 4},
        "stages": {"codes": {"epochs": 8, "lr": 1e-3}, "warmup": {"epochs": 0}},
    }
    cut = one_epoch(params)
    assert cut["stages"] == {"codes": {"epochs": 1, "lr": 1e-3}, "warmup": {"epochs": 0}}
    assert cut["lm"] == params["lm"] and params["stages"]["codes"]["epochs"] == 8  # not mutated


def test_failed_requests_count_in_the_latency_tail_but_not_in_throughput() -> None:
    # 98 answers in 10 ms and two requests that timed out after 30 s: before, p99 was 10 ms.
    row = summary([0.01] * 98, errors=2, seconds=1.0, failed=[30.0, 30.0])
    assert row["p99_ms"] > 1000 and row["p50_ms"] == pytest.approx(10.0)
    assert row["rps"] == 98 and row["requests"] == 100 and row["errors"] == 2


def test_autoscale_windows_count_completions_when_they_arrive() -> None:
    from benchmarks.serve_autoscale import ERROR, OK, TIMEOUT, windows

    # 10 requests sent in the first second, each answered 2.5 s later (a backlog), one the client
    # gave up on after 30 s and one the server failed at once.
    results = [(i / 10, 2.5, OK) for i in range(10)] + [(0.5, 30.0, TIMEOUT), (0.6, 0.01, ERROR)]
    rows = windows(results, samples=[], window=1.0, end=4.0)
    assert [r["offered_rps"] for r in rows] == [12, 0, 0, 0]
    # Before, completed req/s was counted by send time and equalled offered minus errors (10, 0, 0, 0).
    assert [r["rps"] for r in rows] == [0, 0, 5, 5]
    assert rows[0]["p99_ms"] > 2500
    # A backlog's timeouts are told apart from the server's failures (both were "errors").
    assert (rows[0]["errors"], rows[0]["timeouts"]) == (1, 1)


class _SlowChain:
    """A detector and retriever whose calls take ``delay_s`` each, and say when they ran."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.calls: list[tuple[float, float]] = []

    def probabilities(self, texts: list[str]) -> list[float]:
        start = time.perf_counter()
        time.sleep(self.delay_s)
        self.calls.append((start, time.perf_counter()))
        return [1.0] * len(texts)

    def retrieve(self, texts: list[str], k: int) -> list[list[tuple[str, float]]]:
        return [[] for _ in texts]


def test_in_process_req_s_counts_the_time_the_calls_took() -> None:
    # Each call takes longer than the whole measuring window: one call runs, ending after the
    # window; req/s over the nominal window would report 1 / 0.01 s = 100.
    chain = _SlowChain(delay_s=0.05)
    m = in_process(chain, chain, None, ["q"], seconds=0.01)
    (start, end), n = chain.calls[0], len(chain.calls)
    assert n == m["requests"] == 1
    assert m["rps"] <= n / (end - start)


def test_the_in_process_baseline_ranks_as_often_as_the_deployed_graph() -> None:
    # The base scenarios' baseline ranked every query twice while the graph (share_ranking on by
    # default) ranked it once, halving their ratios; a Serve config turning it off was ignored.
    flags = {"artifact": "a", "catalog": "c"}
    assert ranks_once(app_args({"applications": [{"args": {}}]}, flags, [])) is True
    off = {"applications": [{"args": {"share_ranking": False}}]}
    assert ranks_once(app_args(off, flags, [])) is False
    assert ranks_once(app_args(off, {**flags, "share_ranking": True}, [])) is True
    overridden = app_args({"applications": [{"args": {}}]}, flags, ["serve.share_ranking=false"])
    assert ranks_once(overridden) is False


def sweep_row(model: str, size: int, wait: float, p50_1: float, rps_8: float) -> dict:
    config = {"model": model, "max_batch_size": size, "batch_wait_timeout_s": wait}
    return {"method": "serve: sweep", "config": config, "metrics": {"p50_ms_1": p50_1, "rps_8": rps_8}}


def test_the_batching_rule_picks_the_best_shared_setting_or_says_none_qualifies() -> None:
    from benchmarks.serve_batching import select

    rows = [
        sweep_row("bm25", 8, 0.0, 6.4, 285),
        sweep_row("bm25", 16, 0.0, 6.8, 300),  # within 10% of bm25's best p50
        sweep_row("bm25", 8, 0.01, 19.6, 400),  # faster for 8 clients, but a lone request waits
        sweep_row("dense", 8, 0.0, 20.4, 50),
        sweep_row("dense", 16, 0.0, 21.0, 61),
    ]
    assert select(rows) == (16, 0.0)  # the best worse-of-the-two share among shared settings
    # A noisy run where no setting is within 10% of the best for both models: said, not max({}).
    with pytest.raises(ValueError, match=r"no setting's 1-client p50 is within 1\.10x"):
        select([rows[0], sweep_row("dense", 8, 0.0, 26.4, 50), sweep_row("dense", 16, 0.0, 20.4, 61)])
