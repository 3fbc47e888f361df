"""Prometheus text-format metrics (no client library needed)."""

from __future__ import annotations

import threading

# latency buckets in seconds
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _esc(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(d: dict) -> str:
    if not d:
        return ""
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in d.items()) + "}"


class _Histogram:
    __slots__ = ("counts", "sum", "count")

    def __init__(self):
        self.counts = [0] * len(BUCKETS)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float):
        for i, b in enumerate(BUCKETS):
            if v <= b:
                self.counts[i] += 1
                break
        self.sum += v
        self.count += 1


class Metrics:
    """Thread-safe counters, gauges and histograms keyed by model (and version)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._requests: dict[tuple, int] = {}   # (model, version, status) -> count
        self._latency: dict[tuple, _Histogram] = {}  # (model, version) -> request latency
        self._compute: dict[tuple, _Histogram] = {}  # (model, version) -> session.run time
        self._queue: dict[str, int] = {}        # model -> requests waiting for a worker / batch
        self._inflight: dict[str, int] = {}     # model -> requests being computed
        self._batches: dict[str, int] = {}      # model -> executed batches (session.run calls)
        self._batched: dict[str, int] = {}      # model -> requests carried by those batches
        self._http_errors: dict[int, int] = {}  # status code -> count (requests rejected before reaching a model)

    def request(self, model: str, version: str, ok: bool, seconds: float):
        with self._lock:
            k = (model, version, "success" if ok else "failure")
            self._requests[k] = self._requests.get(k, 0) + 1
            self._latency.setdefault((model, version), _Histogram()).observe(seconds)

    def compute(self, model: str, version: str, seconds: float, n_requests: int):
        with self._lock:
            self._compute.setdefault((model, version), _Histogram()).observe(seconds)
            self._batches[model] = self._batches.get(model, 0) + 1
            self._batched[model] = self._batched.get(model, 0) + n_requests

    def queue(self, model: str, delta: int):
        with self._lock:
            self._queue[model] = self._queue.get(model, 0) + delta

    def inflight(self, model: str, delta: int):
        with self._lock:
            self._inflight[model] = self._inflight.get(model, 0) + delta

    def http_error(self, status: int):
        with self._lock:
            self._http_errors[status] = self._http_errors.get(status, 0) + 1

    def queue_depth(self, model: str) -> int:
        with self._lock:
            return self._queue.get(model, 0)

    def counts(self, model: str) -> dict:
        """{'success': n, 'failure': n} summed over versions (for statistics endpoints and tests)."""
        with self._lock:
            out = {"success": 0, "failure": 0}
            for (m, _v, s), c in self._requests.items():
                if m == model:
                    out[s] += c
            return out

    def render(self, models=()) -> str:
        """Prometheus exposition format 0.0.4."""
        lines = []
        models = list(models)  # (model, version) pairs
        names = {m for m, _ in models}  # gauges are per model

        def hist(name, help_, data):
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} histogram")
            for (m, v), h in sorted(data.items()):
                cum = 0
                for b, c in zip(BUCKETS, h.counts):
                    cum += c
                    lines.append(f"{name}_bucket{_labels({'model': m, 'version': v, 'le': repr(float(b))})} {cum}")
                lines.append(f"{name}_bucket{_labels({'model': m, 'version': v, 'le': '+Inf'})} {h.count}")
                lines.append(f"{name}_sum{_labels({'model': m, 'version': v})} {h.sum:.9f}")
                lines.append(f"{name}_count{_labels({'model': m, 'version': v})} {h.count}")

        def gauge(name, help_, data, kind="gauge"):
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} {kind}")
            for m in sorted(set(data) | names):
                lines.append(f"{name}{_labels({'model': m})} {data.get(m, 0)}")

        with self._lock:
            lines.append("# HELP onnxpy_inference_requests_total Inference requests by model, version and outcome.")
            lines.append("# TYPE onnxpy_inference_requests_total counter")
            keys = set(self._requests)
            for m, v in models:
                keys |= {(m, v, "success"), (m, v, "failure")}
            for k in sorted(keys):
                m, v, s = k
                lines.append(f"onnxpy_inference_requests_total{_labels({'model': m, 'version': v, 'status': s})} "
                             f"{self._requests.get(k, 0)}")
            hist("onnxpy_inference_request_duration_seconds",
                 "End-to-end infer request latency (parse, queue, compute, encode).", self._latency)
            hist("onnxpy_inference_compute_duration_seconds",
                 "Time in session.run per executed (possibly batched) call.", self._compute)
            gauge("onnxpy_inference_queue_depth", "Requests waiting for a worker thread or a batch.", self._queue)
            gauge("onnxpy_inference_inflight", "Requests being computed.", self._inflight)
            gauge("onnxpy_inference_executions_total", "session.run calls (one per batch).", self._batches,
                  "counter")
            gauge("onnxpy_inference_batched_requests_total", "Requests served by those calls.", self._batched,
                  "counter")
            lines.append("# HELP onnxpy_http_errors_total Requests rejected with an error status.")
            lines.append("# TYPE onnxpy_http_errors_total counter")
            for code, c in sorted(self._http_errors.items()):
                lines.append(f"onnxpy_http_errors_total{_labels({'code': str(code)})} {c}")
        return "\n".join(lines) + "\n"
