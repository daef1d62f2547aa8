"""The server's Prometheus metrics (named like vLLM's where they exist) and the middleware that
counts requests by route and status."""

from __future__ import annotations

import resource

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, ProcessCollector

from quickdraft.types import GenerationResult


class Metrics:
    """Prometheus counters and gauges (own registry per app)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "quickdraft:requests", "HTTP requests by route and status", ["route", "status"], registry=r
        )
        self.generated = Counter("quickdraft:generation_tokens", "generated tokens", registry=r)
        self.cached = Counter("quickdraft:prompt_tokens_cached", "prompt tokens a kept prefix held", registry=r)
        self.drafts = Counter("quickdraft:spec_decode_num_drafts", "draft/verify rounds with drafts", registry=r)
        self.draft_tokens = Counter("quickdraft:spec_decode_num_draft_tokens", "draft tokens", registry=r)
        self.accepted = Counter("quickdraft:spec_decode_num_accepted_tokens", "accepted draft tokens", registry=r)
        self.accepted_pos = Counter(
            "quickdraft:spec_decode_num_accepted_tokens_per_pos",
            "accepted draft tokens per draft position",
            ["position"],
            registry=r,
        )
        self.pending = Gauge("quickdraft:num_requests_pending", "running + waiting requests", registry=r)
        self.running = Gauge("quickdraft:num_requests_running", "requests in the running batch", registry=r)
        self.waiting = Gauge("quickdraft:num_requests_waiting", "requests queued behind the batch", registry=r)
        self.max_batch = Gauge("quickdraft:max_batch_size", "the most requests decoded together", registry=r)
        ProcessCollector(registry=r)  # process_resident_memory_bytes, process_cpu_seconds_total, ...
        self.peak = Gauge("quickdraft:peak_resident_memory_bytes", "the process's peak resident memory", registry=r)
        self.peak.set_function(peak_rss)
        self.kv_bytes = Histogram(
            "quickdraft:request_kv_cache_bytes",
            "the most KV cache bytes a request held (target + draft model)",
            buckets=[2**k for k in range(16, 36, 2)],  # 64 KiB .. 16 GiB
            registry=r,
        )
        self.defaults = Info("quickdraft:defaults", "what the defaults chose (weights, drafter) and why", registry=r)

    def chose(self, choices: dict[str, str]) -> None:
        """The engine's defaults (`Engine.choices`: {"weights": "VALUE: why", ...}) as labels."""
        labels = {}
        for what, text in choices.items():
            value, _, why = text.partition(": ")
            labels[what], labels[f"{what}_reason"] = value, why
        self.defaults.info(labels)

    def observe(self, result: GenerationResult) -> None:
        s = result.stats
        self.generated.inc(s.num_new_tokens)
        self.cached.inc(s.cached_prompt_tokens)
        self.kv_bytes.observe(s.kv_cache_bytes)
        self.drafts.inc(s.num_drafts)
        self.draft_tokens.inc(s.num_draft_tokens)
        self.accepted.inc(s.num_accepted_draft_tokens)
        for pos, n in enumerate(s.accepted_per_position):
            self.accepted_pos.labels(position=str(pos)).inc(n)


class CountRequests:
    """Pure ASGI middleware counting requests by route and status (BaseHTTPMiddleware would hide
    client disconnects from the handlers)."""

    def __init__(self, app, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = {"code": 500}

        async def send_counted(message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        finally:
            self.metrics.requests.labels(route=scope["path"], status=str(status["code"])).inc()


def peak_rss() -> int:
    """The process's peak resident memory in bytes (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory() -> dict:
    """Resident and peak memory in MiB, as /health reports them."""
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * resource.getpagesize()
    peak = max(rss, peak_rss())  # the kernel's high-water mark is updated lazily: never below now
    return {"rss_mib": round(rss / 2**20, 1), "peak_rss_mib": round(peak / 2**20, 1)}
