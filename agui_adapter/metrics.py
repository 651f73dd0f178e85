"""The adapter's Prometheus metrics, and their text exposition for ``GET /metrics``.

Operators alert on numbers, not on log lines: how many runs are open, how runs end
(success, interrupt, error, abandoned) and with which error codes, what the HTTP edge
answers, how many events go out, whether the kernel is up, how long the kernel takes to
say something and a run to end, and how many SSE clients go away mid-run. This module
owns those series and nothing else; the places that see the facts (``run_driver``,
``runs``, ``web``) call one method each.

Two backends behind one ``Metrics`` object:

- **built-in** (the default): a small thread-safe registry of our own (counters, gauges,
  histograms) rendered here in the Prometheus text format 0.0.4. Correct for one process:
  ``python run.py``, or a WSGI server with a single worker process.
- **prometheus_client in multiprocess mode**, chosen when ``PROMETHEUS_MULTIPROC_DIR``
  names a directory and the optional ``metrics`` extra (``prometheus_client``) is
  installed: every worker process writes its values to files in that directory, and a
  scrape answered by any worker adds up all of them (gunicorn ``-w N``). The runs-active
  gauge sums the live workers only (``livesum``; gunicorn's ``child_exit`` hook should call
  ``prometheus_client.multiprocess.mark_process_dead``). Without the package the built-in
  registry is used and a warning says that each worker then reports only itself.

``agui_kernel_up`` is never stored: each scrape asks the kernel's health, cached for
``KERNEL_UP_TTL`` seconds so that scrapes stay cheap and cannot flood the kernel.
The hot path (events sent) is one counter add per written chunk, never per event.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

log = logging.getLogger("agui_adapter.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
KERNEL_UP_TTL = 5.0

OUTCOMES = ("success", "interrupt", "error", "abandoned")
FIRST_EVENT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
DURATION_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)

# name, help; the label names and kinds are given where the series are made (``_series``)
RUNS_ACTIVE = ("agui_runs_active", "Runs whose SSE response is open.")
RUNS = ("agui_runs_total", "Runs that ended, by outcome (success, interrupt, error, abandoned).")
RUN_ERRORS = ("agui_run_errors_total", "Runs that ended with RUN_ERROR, by error code.")
HTTP_REQUESTS = ("agui_http_requests_total", "HTTP requests answered, by route (endpoint name) and status.")
EVENTS_SENT = ("agui_events_sent_total", "AG-UI events written to SSE streams.")
KERNEL_UP = ("agui_kernel_up", "1 when the kernel answers its health check (cached a few seconds), else 0.")
FIRST_EVENT = (
    "agui_run_first_event_seconds",
    "Seconds from a run's admission to its first event after RUN_STARTED (the kernel's first answer).",
)
RUN_DURATION = ("agui_run_duration_seconds", "Seconds from a run's admission to its end.")
DISCONNECTS = ("agui_sse_clients_disconnected_total", "SSE clients that went away before their run ended.")
REATTACHES = ("agui_reattaches_total", "Streams of a run opened again with Last-Event-ID or GET .../events.")
ADOPTIONS = ("agui_runs_adopted_total", "Runs taken over from an adapter process that died or handed them over.")


# ====================================================================== the built-in registry
def _number(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    if value == float("-inf"):
        return "-Inf"
    return repr(float(value))


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _labels(names: Sequence[str], values: Sequence[str], extra: tuple[str, str] | None = None) -> str:
    pairs = list(zip(names, values, strict=True))
    if extra is not None:
        pairs.append(extra)
    if not pairs:
        return ""
    return "{" + ",".join(f'{name}="{_escape_label(value)}"' for name, value in pairs) + "}"


class _Value:
    """One counter or gauge value."""

    __slots__ = ("_lock", "value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        with self._lock:
            self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        with self._lock:
            self.value -= amount

    def samples(self, name: str, labels: str) -> list[str]:
        return [f"{name}{labels} {_number(self.value)}"]


class _Buckets:
    """One histogram: counts per bucket (not cumulative until rendered), sum and count."""

    __slots__ = ("_bounds", "_counts", "_lock", "_sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self._lock = threading.Lock()
        self._bounds = list(bounds)
        self._counts = [0] * (len(self._bounds) + 1)  # the last one is +Inf
        self._sum = 0.0

    def observe(self, amount: float) -> None:
        index = bisect.bisect_left(self._bounds, amount)
        with self._lock:
            self._counts[index] += 1
            self._sum += amount

    def samples(self, name: str, names: Sequence[str], values: Sequence[str]) -> list[str]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        lines, cumulative = [], 0
        for bound, count in zip([*self._bounds, float("inf")], counts, strict=True):
            cumulative += count
            lines.append(f"{name}_bucket{_labels(names, values, ('le', _number(bound)))} {_number(cumulative)}")
        lines.append(f"{name}_sum{_labels(names, values)} {_number(total)}")
        lines.append(f"{name}_count{_labels(names, values)} {_number(cumulative)}")
        return lines


class _Family:
    """A metric and its labelled children, prometheus_client-style (``labels(...).inc()``)."""

    def __init__(self, kind: str, name: str, documentation: str, labelnames: Sequence[str] = (), **options: Any):
        self.kind, self.name, self.documentation = kind, name, documentation
        self.labelnames = tuple(labelnames)
        self._buckets: tuple[float, ...] = tuple(options.get("buckets", ()))
        self._lock = threading.Lock()
        self._children: dict[tuple[str, ...], Any] = {}
        if not self.labelnames:
            self._default = self.labels()

    def _new_child(self) -> Any:
        return _Buckets(self._buckets) if self.kind == "histogram" else _Value()

    def labels(self, *values: str) -> Any:
        key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            if len(key) != len(self.labelnames):
                raise ValueError(f"{self.name} takes the labels {self.labelnames}")
            with self._lock:
                child = self._children.setdefault(key, self._new_child())
        return child

    # unlabelled metrics are used directly
    def inc(self, amount: float = 1.0) -> None:
        self._default.inc(amount)

    def dec(self, amount: float = 1.0) -> None:
        self._default.dec(amount)

    def observe(self, amount: float) -> None:
        self._default.observe(amount)

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {_escape_help(self.documentation)}", f"# TYPE {self.name} {self.kind}"]
        with self._lock:
            children = sorted(self._children.items())
        for values, child in children:
            if self.kind == "histogram":
                lines += child.samples(self.name, self.labelnames, values)
            else:
                lines += child.samples(self.name, _labels(self.labelnames, values))
        return lines


class BuiltinRegistry:
    """The registry of one process (thread-safe); ``render`` writes the text format."""

    multiprocess = False

    def __init__(self) -> None:
        self._families: list[_Family] = []

    def make(self, kind: str, name: str, documentation: str, labelnames: Sequence[str] = (), **options: Any) -> Any:
        family = _Family(kind, name, documentation, labelnames, **options)
        self._families.append(family)
        return family

    def render(self, kernel_up: float | None) -> bytes:
        lines: list[str] = []
        for family in self._families:
            lines += family.render()
        if kernel_up is not None:
            name, documentation = KERNEL_UP
            lines += [f"# HELP {name} {documentation}", f"# TYPE {name} gauge", f"{name} {_number(kernel_up)}"]
        return ("\n".join(lines) + "\n").encode("utf-8")


# ====================================================================== prometheus_client, multiprocess
class PrometheusMultiprocessRegistry:
    """prometheus_client's metrics in multiprocess mode: values live in files under
    ``PROMETHEUS_MULTIPROC_DIR``, and ``render`` collects those of every process."""

    multiprocess = True

    def __init__(self) -> None:
        import prometheus_client  # the optional ``metrics`` extra

        self._client = prometheus_client
        self._kinds = {
            "counter": prometheus_client.Counter,
            "gauge": prometheus_client.Gauge,
            "histogram": prometheus_client.Histogram,
        }

    def make(self, kind: str, name: str, documentation: str, labelnames: Sequence[str] = (), **options: Any) -> Any:
        if kind == "gauge":
            options.setdefault("multiprocess_mode", "livesum")
        # registry=None: the values are written to the directory; a scrape reads them all
        return self._kinds[kind](name, documentation, labelnames=tuple(labelnames), registry=None, **options)

    def render(self, kernel_up: float | None) -> bytes:
        from prometheus_client import CollectorRegistry, generate_latest, multiprocess
        from prometheus_client.core import GaugeMetricFamily

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        if kernel_up is not None:
            gauge = GaugeMetricFamily(KERNEL_UP[0], KERNEL_UP[1], value=kernel_up)

            class KernelUp:
                def collect(self) -> Iterable[Any]:
                    return [gauge]

            registry.register(KernelUp())  # type: ignore[arg-type]
        return bytes(generate_latest(registry))


class Registry(Protocol):
    multiprocess: bool

    def make(self, kind: str, name: str, documentation: str, labelnames: Sequence[str] = (), **options: Any) -> Any:
        """A metric with prometheus_client's interface (``labels``, ``inc``, ``dec``, ``observe``)."""

    def render(self, kernel_up: float | None) -> bytes:
        """The text exposition of every series (``kernel_up``: None to leave it out)."""


_multiprocess_metrics: Metrics | None = None
_multiprocess_lock = threading.Lock()


# ====================================================================== the adapter's metrics
class KernelUpProbe:
    """The kernel's health as 1.0 / 0.0, asked at most once per ``ttl`` seconds."""

    def __init__(self, health: Callable[[], bool], ttl: float = KERNEL_UP_TTL) -> None:
        self._health = health
        self._ttl = ttl
        self._lock = threading.Lock()
        self._value = 0.0
        self._until = float("-inf")

    def value(self) -> float:
        with self._lock:
            now = time.monotonic()
            if now >= self._until:
                try:
                    self._value = 1.0 if self._health() else 0.0
                except Exception:  # noqa: BLE001 - a failing probe means down
                    self._value = 0.0
                self._until = now + self._ttl
            return self._value


class Metrics:
    """Every series of the adapter; one instance per process (``for_environment``)."""

    def __init__(self, registry: Registry | None = None, kernel_health: Callable[[], bool] | None = None) -> None:
        self.registry: Registry = registry if registry is not None else BuiltinRegistry()
        self.kernel_up = KernelUpProbe(kernel_health) if kernel_health is not None else None
        make = self.registry.make
        self._runs_active = make("gauge", *RUNS_ACTIVE)
        self._runs = make("counter", *RUNS, labelnames=("outcome",))
        self._run_errors = make("counter", *RUN_ERRORS, labelnames=("code",))
        self._http = make("counter", *HTTP_REQUESTS, labelnames=("route", "status"))
        self._events = make("counter", *EVENTS_SENT)
        self._first_event = make("histogram", *FIRST_EVENT, buckets=FIRST_EVENT_BUCKETS)
        self._duration = make("histogram", *RUN_DURATION, buckets=DURATION_BUCKETS)
        self._disconnects = make("counter", *DISCONNECTS)
        self._reattaches = make("counter", *REATTACHES)
        self._adoptions = make("counter", *ADOPTIONS)
        self._outcomes = {outcome: self._runs.labels(outcome) for outcome in OUTCOMES}  # all four exist at 0

    @classmethod
    def for_environment(
        cls, kernel_health: Callable[[], bool] | None = None, env: dict[str, str] | None = None
    ) -> Metrics:
        """prometheus_client's multiprocess mode when ``PROMETHEUS_MULTIPROC_DIR`` is set
        (one instance per process, shared), else the built-in registry."""
        global _multiprocess_metrics
        env = dict(os.environ) if env is None else env
        directory = env.get(MULTIPROC_ENV, "")
        if not directory:
            return cls(kernel_health=kernel_health)
        if not os.path.isdir(directory):
            log.warning("%s is not a directory: metrics count this process only", MULTIPROC_ENV)
            return cls(kernel_health=kernel_health)
        with _multiprocess_lock:
            if _multiprocess_metrics is not None:
                return _multiprocess_metrics
            try:
                registry = PrometheusMultiprocessRegistry()
            except ImportError:
                log.warning(
                    "%s is set but prometheus_client is not installed (pip install agui-adapter[metrics]): "
                    "metrics count this process only",
                    MULTIPROC_ENV,
                )
                return cls(kernel_health=kernel_health)
            _multiprocess_metrics = cls(registry, kernel_health)
            return _multiprocess_metrics

    @property
    def multiprocess(self) -> bool:
        return self.registry.multiprocess

    # ------------------------------------------------------------------ what happened
    def run_opened(self) -> None:
        self._runs_active.inc()

    def run_closed(self) -> None:
        self._runs_active.dec()

    def run_finished(self, outcome: str, code: str | None, seconds: float) -> None:
        counter = self._outcomes.get(outcome)
        (counter if counter is not None else self._runs.labels(outcome)).inc()
        if code:
            self._run_errors.labels(code).inc()
        self._duration.observe(seconds)

    def first_event(self, seconds: float) -> None:
        self._first_event.observe(seconds)

    def events_sent(self, count: int) -> None:
        self._events.inc(count)

    def client_disconnected(self) -> None:
        self._disconnects.inc()

    def reattached(self) -> None:
        self._reattaches.inc()

    def adopted(self) -> None:
        self._adoptions.inc()

    def http_request(self, route: str, status: str) -> None:
        self._http.labels(route, status).inc()

    # ------------------------------------------------------------------ the scrape
    def render(self) -> bytes:
        """The text exposition of every series, kernel_up included when a probe is set."""
        kernel_up = self.kernel_up.value() if self.kernel_up is not None else None
        return self.registry.render(kernel_up)
