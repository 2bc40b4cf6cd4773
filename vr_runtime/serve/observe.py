"""What operators watch: an access log line per request, counts by outcome for ``/health``, and
Prometheus metrics for ``GET /metrics``.

:class:`Observer` is the outermost ASGI layer, so it sees every answer the server gives -- the
413s of the body limit and the 499s of clients that left included. It counts requests to the API
(``/v1/...``; probes of ``/health`` and ``/metrics`` would drown them) by HTTP status; a client
that disconnects before any answer is counted as 499. The endpoint leaves the answer's report in
``scope["state"]["videorouter_report"]`` for the token counts and stage timings.

Metrics (one registry per app, so several apps in one process -- tests -- do not collide):
``videorouter_requests_total{status}``, ``videorouter_request_seconds`` (histogram, arrival to
last byte), ``videorouter_queue_waiting`` / ``videorouter_queue_running`` (gauges read at
scrape time), ``videorouter_stage_seconds{stage}`` (histogram of the report's ``timings_s``:
decode, encode, route, prefill, generate ...), ``videorouter_prompt_tokens_total`` and
``videorouter_generated_tokens_total``.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Callable

from prometheus_client import (CollectorRegistry, Counter as PCounter, Gauge, Histogram,
                               generate_latest)

access_log = logging.getLogger("videorouter.serve.access")

REPORT_KEY = "videorouter_report"     # scope["state"][REPORT_KEY]: the answer's report
API_PREFIX = "/v1/"
STAGE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Observer:
    def __init__(self, app, stats: Callable[[], dict]):
        """``stats``: the engine's queue counters (``Engine.stats``), read at scrape time."""
        self.app = app
        self._lock = threading.Lock()
        self.by_status: Counter = Counter()
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = PCounter("videorouter_requests", "API requests answered, by HTTP status",
                                 ["status"], registry=r)
        self.latency = Histogram("videorouter_request_seconds", "API request latency, arrival "
                                 "to the last byte", buckets=STAGE_BUCKETS, registry=r)
        self.stages = Histogram("videorouter_stage_seconds", "time per pipeline stage of an "
                                "answered request (the report's timings_s)", ["stage"],
                                buckets=STAGE_BUCKETS, registry=r)
        self.prompt_tokens = PCounter("videorouter_prompt_tokens", "prompt tokens of answered "
                                      "requests (after compression)", registry=r)
        self.generated_tokens = PCounter("videorouter_generated_tokens", "generated tokens",
                                         registry=r)
        for name, key in (("waiting", "waiting"), ("running", "running")):
            g = Gauge(f"videorouter_queue_{name}", f"requests {name} for the model", registry=r)
            g.set_function(lambda key=key: float(stats().get(key, 0)))

    def counts(self) -> dict:
        with self._lock:
            counts = dict(sorted(self.by_status.items()))
        return {"total": sum(counts.values()), "by_status": counts}

    def metrics(self) -> bytes:
        return generate_latest(self.registry)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope.get("path", "").startswith(API_PREFIX):
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        scope.setdefault("state", {})
        status = None

        async def watching_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, watching_send)
        finally:
            self._record(scope, status or 499, time.perf_counter() - t0)

    def _record(self, scope, status: int, seconds: float) -> None:
        report = scope["state"].get(REPORT_KEY) or {}
        prompt = int(report.get("prompt_tokens") or 0)
        generated = int(report.get("generated_tokens") or 0)
        with self._lock:
            self.by_status[str(status)] += 1
        self.requests.labels(str(status)).inc()
        self.latency.observe(seconds)
        if report:
            self.prompt_tokens.inc(prompt)
            self.generated_tokens.inc(generated)
            for stage, s in (report.get("timings_s") or {}).items():
                if isinstance(s, (int, float)):
                    self.stages.labels(stage).observe(float(s))
        if access_log.isEnabledFor(logging.INFO):
            client = scope.get("client") or ("-", 0)
            access_log.info('%s "%s %s" %d %.3fs prompt_tokens=%d completion_tokens=%d',
                            client[0], scope.get("method"), scope.get("path"), status, seconds,
                            prompt, generated)
