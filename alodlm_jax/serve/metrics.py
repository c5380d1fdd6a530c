"""The server's Prometheus metrics (``prometheus_client``, in a registry of their own)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300)


class Metrics:
    """Requests by outcome, waiting and running requests, generated tokens, time to first token
    and request latency, recurrent passes per generated token."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("alodlm_requests", "Requests by endpoint and outcome (HTTP status).",
                                ["endpoint", "status"], registry=r)
        self.waiting = Gauge("alodlm_requests_waiting", "Requests waiting for a slot.", registry=r)
        self.running = Gauge("alodlm_requests_running", "Requests decoding in a slot.", registry=r)
        self.tokens = Counter("alodlm_generated_tokens", "Tokens the engine decoded (a "
                              "cancelled request's included).",
                              registry=r)
        self.ttft = Histogram("alodlm_time_to_first_token_seconds", "Seconds from a request's "
                              "arrival to its first committed token.", buckets=_LATENCY_BUCKETS,
                              registry=r)
        self.latency = Histogram("alodlm_request_latency_seconds", "Seconds from a request's "
                                 "arrival to its last token.", buckets=_LATENCY_BUCKETS,
                                 registry=r)
        self.passes = Histogram("alodlm_recurrent_passes_per_token", "A request's recurrent "
                                "passes divided by its generated tokens.",
                                buckets=(0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4, 6, 8, 12, 16, 32),
                                registry=r)

    def finished(self, output) -> None:
        """A request's decoding ended (a cancelled one's partial output included)."""
        self.tokens.inc(len(output.token_ids))
        if output.token_ids:
            self.passes.observe(output.recurrent_passes / len(output.token_ids))

    def slots(self, waiting: int, running: int) -> None:
        self.waiting.set(waiting)
        self.running.set(running)
