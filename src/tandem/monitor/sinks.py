"""Optional live sinks beside the run store: TensorBoard event files, a Prometheus endpoint.

Each sink has the Recorder's interface (`window`, `values`, `event`, `finish`), so rank
0 can hand a logging window to the store and to any sink the same way. The packages
are optional (`pip install 'tandem[sinks]'`): a sink asked for without its package is
a configuration error naming the setting and the install command, raised before the
run starts rather than a failure in the middle of it.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tandem.status import RunStatus

if TYPE_CHECKING:  # for annotations only: the sinks never build a Window
    from tandem.monitor.live import Window

log = logging.getLogger("tandem")

# Rows with this rank are for the whole job (see tandem.monitor.live.Row).
JOB_RANK = -1
# Seconds finish() waits for the endpoint's thread after shutting its server down.
SHUTDOWN_WAIT_S = 5.0


class Sink(Protocol):
    """What rank 0 hands a run's figures to (the Recorder and every sink here)."""

    def window(self, window: Window) -> None: ...

    def values(self, step: int, values: dict[str, float]) -> None: ...

    def event(self, step: int, kind: str, message: str, value: float | None = None,
              threshold: float | None = None, rank: int = -1) -> None: ...

    def finish(self, status: str, summary: dict[str, Any]) -> None: ...


def _no_tensorboard(log_dir: str, why: str) -> ValueError:
    return ValueError(
        f"monitor.tensorboard = {log_dir!r} needs the tensorboard package ({why}); install "
        "it with `pip install tensorboard` (or `pip install 'tandem[sinks]'`), or set "
        'monitor.tensorboard to ""')


def _no_prometheus(port: int) -> ValueError:
    return ValueError(
        f"monitor.prometheus_port = {port} needs the prometheus_client package; install it "
        "with `pip install prometheus_client` (or `pip install 'tandem[sinks]'`), or set "
        "monitor.prometheus_port to -1")


def _missing(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is None
    except (ImportError, ValueError):  # a broken or None entry in sys.modules
        return True


def check_sink_packages(tensorboard: str, prometheus_port: int) -> None:
    """Raise ValueError, before a run starts and on every rank, if a sink that the
    settings ask for lacks its package (imports nothing heavy)."""
    if prometheus_port < -1 or prometheus_port > 65535:
        raise ValueError(f"monitor.prometheus_port: {prometheus_port} is not allowed; use -1 "
                         "(off), 0 (a free port) or a port up to 65535")
    if tensorboard and _missing("tensorboard"):
        raise _no_tensorboard(tensorboard, "not installed")
    if prometheus_port >= 0 and _missing("prometheus_client"):
        raise _no_prometheus(prometheus_port)


def scalar_tag(rank: int, name: str) -> str:
    """The TensorBoard tag of a row: the name for the job, `rank{r}/<name>` per rank."""
    return name if rank == JOB_RANK else f"rank{rank}/{name}"


def _event_text(kind: str, message: str, value: float | None, threshold: float | None,
                rank: int) -> str:
    parts = [message]
    if value is not None:
        parts.append(f"value {value:.6g}")
    if threshold is not None:
        parts.append(f"threshold {threshold:.6g}")
    if rank != JOB_RANK:
        parts.append(f"rank {rank}")
    return f"**{kind}**: " + "; ".join(parts)


class TensorBoardSink:
    """Writes every row as a scalar and every event as text into `log_dir`."""

    def __init__(self, log_dir: Path) -> None:
        try:
            # torch's wrapper imports the tensorboard package and raises ImportError
            # (or ModuleNotFoundError) when it is missing or too old.
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise _no_tensorboard(str(log_dir), str(err)) from err
        self.log_dir = Path(log_dir)
        self._writer = SummaryWriter(log_dir=str(self.log_dir))
        self._closed = False

    def window(self, window: Window) -> None:
        """Every row of a logging window as a scalar, every event as text."""
        for step, rank, name, value in window.rows:
            self._writer.add_scalar(scalar_tag(rank, name), value, step)
        for event in window.events:
            self.event(event.step, event.kind, event.message, event.value, event.threshold)

    def values(self, step: int, values: dict[str, float]) -> None:
        """Job-wide values measured once (evaluation, calibration)."""
        for name, value in values.items():
            self._writer.add_scalar(name, value, step)

    def event(self, step: int, kind: str, message: str, value: float | None = None,
              threshold: float | None = None, rank: int = -1) -> None:
        """An event as a text entry under `events/<kind>`."""
        self._writer.add_text(f"events/{kind}",
                              _event_text(kind, message, value, threshold, rank), step)

    def finish(self, status: str, summary: dict[str, Any]) -> None:
        """Write the outcome as text and close the event file. Idempotent."""
        if self._closed:
            return
        self._closed = True
        text = f"status **{status}**\n\n    " + json.dumps(summary, indent=2, default=str,
                                                          sort_keys=True).replace("\n", "\n    ")
        self._writer.add_text("summary", text, int(summary.get("steps", 0) or 0))
        self._writer.close()


_INVALID = re.compile(r"[^a-zA-Z0-9_:]")


def metric_name(name: str) -> str:
    """The Prometheus name of a row: `tandem_` + the name, '/' and other invalid
    characters replaced by '_' (Prometheus allows [a-zA-Z0-9_:] only)."""
    return "tandem_" + _INVALID.sub("_", name)


def _rank_label(rank: int) -> str:
    return "job" if rank == JOB_RANK else str(rank)


class PrometheusSink:
    """Serves the latest value of every row as a gauge on http://host:port/metrics.

    A registry of its own, not prometheus_client's global one: two sinks in one
    process (tests, a tuner running trials) must not collide on metric names, and the
    endpoint shows tandem's figures only. Port 0 picks a free port (see `.port`).
    """

    def __init__(self, port: int, host: str = "127.0.0.1", run: str = "") -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"monitor.prometheus_port: {port} is not a TCP port; use 0 (a "
                             "free port) to 65535, or -1 to turn the endpoint off")
        try:
            import prometheus_client
        except ImportError as err:
            raise _no_prometheus(port) from err
        self._client = prometheus_client
        self.run = run
        self.host = host
        self.registry = prometheus_client.CollectorRegistry()
        self._gauges: dict[str, Any] = {}
        self._refused: set[str] = set()
        self._lock = threading.Lock()
        self._events = prometheus_client.Counter(
            "tandem_events", "events recorded by tandem, by kind", ["kind", "run"],
            registry=self.registry)
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.port = self._serve(port, host)

    def _serve(self, port: int, host: str) -> int:
        try:
            started = self._client.start_http_server(port, addr=host, registry=self.registry)
        except OSError as err:
            raise ValueError(f"monitor.prometheus_port: cannot listen on {host}:{port} ({err}); "
                             "pick another port, or 0 for a free one") from err
        if isinstance(started, tuple):  # prometheus_client >= 0.20 hands back the server
            self._server, self._thread = started
            return int(self._server.server_address[1])
        # Older versions keep the server to themselves: no port to report, no shutdown.
        if port == 0:
            log.warning("prometheus_client %s does not report the port it picked; give "
                        "monitor.prometheus_port a fixed port or upgrade the package",
                        getattr(self._client, "__version__", "?"))
        return port

    def _gauge(self, name: str) -> Any:
        """The gauge for a row name, made on first use (None if the name is refused)."""
        gauge = self._gauges.get(name)
        if gauge is not None or name in self._refused:
            return gauge
        with self._lock:
            try:
                gauge = self._client.Gauge(metric_name(name), f"tandem figure {name}",
                                           ["rank", "run"], registry=self.registry)
            except ValueError as err:  # two names that sanitise alike, or a reserved one
                log.warning("prometheus: figure %r is not exported: %s", name, err)
                self._refused.add(name)
                return None
            self._gauges[name] = gauge
        return gauge

    def _set(self, rank: int, name: str, value: float) -> None:
        gauge = self._gauge(name)
        if gauge is not None:
            gauge.labels(rank=_rank_label(rank), run=self.run).set(value)

    def window(self, window: Window) -> None:
        """The latest value of every row; every event counted by kind."""
        for _, rank, name, value in window.rows:
            self._set(rank, name, value)
        self._set(JOB_RANK, "step", float(window.step))
        for event in window.events:
            self.event(event.step, event.kind, event.message, event.value, event.threshold)

    def values(self, step: int, values: dict[str, float]) -> None:
        """Job-wide values measured once (evaluation, calibration)."""
        for name, value in values.items():
            self._set(JOB_RANK, name, value)

    def event(self, step: int, kind: str, message: str, value: float | None = None,
              threshold: float | None = None, rank: int = -1) -> None:
        """Count the event under its kind (the message itself belongs in the store)."""
        self._events.labels(kind=kind, run=self.run).inc()

    def finish(self, status: str, summary: dict[str, Any]) -> None:
        """Stop serving (when this prometheus_client lets us). Idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(SHUTDOWN_WAIT_S)


class Fanout:
    """Several sinks behind one Recorder-like object; a failing sink is logged and
    dropped, never allowed to stop training or hide the run's own outcome."""

    def __init__(self, *sinks: Sink | None) -> None:
        self.sinks: list[Sink] = [s for s in sinks if s is not None]

    def _each(self, what: str, *args: Any) -> None:
        for sink in list(self.sinks):
            try:
                getattr(sink, what)(*args)
            except Exception:  # a sink's failure must not reach the training loop
                log.exception("%s failed in %s; it gets no more figures",
                              type(sink).__name__, what)
                self.sinks.remove(sink)

    def window(self, window: Window) -> None:
        """Hand a logging window to every sink."""
        self._each("window", window)

    def values(self, step: int, values: dict[str, float]) -> None:
        """Hand job-wide values to every sink."""
        self._each("values", step, values)

    def event(self, step: int, kind: str, message: str, value: float | None = None,
              threshold: float | None = None, rank: int = -1) -> None:
        """Hand an event to every sink."""
        self._each("event", step, kind, message, value, threshold, rank)

    def finish(self, status: str, summary: dict[str, Any]) -> None:
        """Finish every sink."""
        self._each("finish", status, summary)


def open_sinks(*, tensorboard: str, prometheus_port: int, prometheus_host: str, run_id: str,
               run_dir: Path) -> list[Sink]:
    """The sinks the monitor settings ask for (none by default).

    `tensorboard` is a directory ("" = off; relative to `run_dir`); `prometheus_port`
    -1 is off, 0 a free port. Raises ValueError for a missing package or a bad port.
    """
    check_sink_packages(tensorboard, prometheus_port)
    sinks: list[Sink] = []
    try:
        if tensorboard:
            sinks.append(TensorBoardSink(run_dir / Path(tensorboard).expanduser()))
        if prometheus_port >= 0:
            sink = PrometheusSink(prometheus_port, prometheus_host, run=run_id)
            log.info("prometheus: figures of run %s at http://%s:%d/metrics", run_id,
                     prometheus_host, sink.port)
            sinks.append(sink)
    except BaseException:
        Fanout(*sinks).finish(RunStatus.FAILED, {})  # close what opened before the failure
        raise
    return sinks
