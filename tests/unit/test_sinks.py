"""The optional live sinks: TensorBoard event files and the Prometheus endpoint."""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tandem.monitor.detect import Event
from tandem.monitor.live import Window
from tandem.monitor.sinks import (
    Fanout,
    PrometheusSink,
    TensorBoardSink,
    check_sink_packages,
    metric_name,
    open_sinks,
    scalar_tag,
)


def _window(step: int, loss: float) -> Window:
    rows = [(step, -1, "loss", loss), (step, -1, "time/step", 0.25),
            (step, 0, "time/step", 0.2), (step, 1, "time/step", 0.3),
            (step, 1, "straggler/score", 1.5)]
    events = [Event("loss_spike", step, loss, 6.0, f"loss {loss} is an outlier")]
    return Window(step=step, loss=loss, samples_per_s=100.0, rows=rows, events=events)


def _fetch(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return reply.read().decode()


def test_names() -> None:
    assert scalar_tag(-1, "time/step") == "time/step"
    assert scalar_tag(3, "time/step") == "rank3/time/step"
    assert metric_name("time/step") == "tandem_time_step"
    assert metric_name("mem/rss-bytes.x") == "tandem_mem_rss_bytes_x"


@pytest.mark.timeout(30)
def test_tensorboard_sink_writes_scalars_and_events(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = TensorBoardSink(tmp_path / "tb")
    sink.window(_window(10, 2.0))
    sink.window(_window(20, 1.5))
    sink.values(20, {"eval_loss": 1.25})
    sink.event(20, "resume", "resumed from step 10", rank=0)
    sink.finish("completed", {"steps": 20, "loss": 1.5})
    sink.finish("completed", {})  # idempotent

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    scalars = set(acc.Tags()["scalars"])
    assert {"loss", "time/step", "rank0/time/step", "rank1/time/step",
            "rank1/straggler/score", "eval_loss"} <= scalars
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(10, 2.0), (20, 1.5)]
    assert [e.value for e in acc.Scalars("rank1/time/step")] == pytest.approx([0.3, 0.3])
    texts = set(acc.Tags()["tensors"])
    assert any(t.startswith("events/loss_spike") for t in texts), texts
    assert any(t.startswith("events/resume") for t in texts), texts
    assert any(t.startswith("summary") for t in texts), texts


@pytest.mark.timeout(30)
def test_prometheus_sink_serves_gauges_on_localhost() -> None:
    pytest.importorskip("prometheus_client")
    sink = PrometheusSink(0, run="r1")
    assert sink.port > 0 and sink.host == "127.0.0.1"
    try:
        sink.window(_window(10, 2.0))
        sink.window(_window(20, 0.5))
        sink.values(20, {"eval/accuracy": 0.75})
        text = _fetch(sink.port)
    finally:
        sink.finish("completed", {"steps": 20})
    assert 'tandem_loss{rank="job",run="r1"} 0.5' in text
    assert 'tandem_time_step{rank="1",run="r1"} 0.3' in text
    assert 'tandem_straggler_score{rank="1",run="r1"} 1.5' in text
    assert 'tandem_eval_accuracy{rank="job",run="r1"} 0.75' in text
    assert 'tandem_step{rank="job",run="r1"} 20.0' in text
    assert 'tandem_events_total{kind="loss_spike",run="r1"} 2.0' in text
    # The sink's own registry: nothing of prometheus_client's process collectors.
    assert "process_cpu_seconds_total" not in text
    with pytest.raises(urllib.error.URLError):
        _fetch(sink.port)
    sink.finish("completed", {})  # idempotent


@pytest.mark.timeout(30)
def test_two_prometheus_sinks_do_not_collide() -> None:
    pytest.importorskip("prometheus_client")
    first, second = PrometheusSink(0, run="a"), PrometheusSink(0, run="b")
    try:
        first.window(_window(1, 1.0))
        second.window(_window(1, 3.0))
        assert 'tandem_loss{rank="job",run="b"} 3.0' in _fetch(second.port)
        assert 'run="b"' not in _fetch(first.port)
    finally:
        first.finish("completed", {})
        second.finish("completed", {})


@pytest.mark.timeout(30)
def test_port_in_use_and_bad_port_name_the_setting() -> None:
    pytest.importorskip("prometheus_client")
    with pytest.raises(ValueError, match="monitor.prometheus_port: 70000"):
        PrometheusSink(70000)
    with pytest.raises(ValueError, match="monitor.prometheus_port: -5"):
        open_sinks(tensorboard="", prometheus_port=-5, prometheus_host="127.0.0.1",
                   run_id="r", run_dir=Path("."))
    first = PrometheusSink(0)
    try:
        with pytest.raises(ValueError, match=f"cannot listen on 127.0.0.1:{first.port}"):
            PrometheusSink(first.port)
    finally:
        first.finish("completed", {})


@pytest.mark.timeout(30)
def test_missing_packages_name_setting_and_install(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    # None in sys.modules makes `import` raise ImportError, as a missing package does.
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ValueError, match=r"monitor.prometheus_port.*pip install prometheus_client"):
        PrometheusSink(0)
    with pytest.raises(ValueError, match=r"monitor.tensorboard.*pip install tensorboard"):
        TensorBoardSink(tmp_path / "tb")
    # The same errors before a run starts, without opening anything.
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(ValueError, match=r"monitor.tensorboard = 'tb'.*pip install tensorboard"):
        check_sink_packages("tb", -1)
    with pytest.raises(ValueError, match=r"monitor.prometheus_port = 0.*pip install prom"):
        check_sink_packages("", 0)
    check_sink_packages("", -1)  # nothing asked for: nothing needed
    with pytest.raises(ValueError, match="monitor.prometheus_port: 70000 is not allowed"):
        check_sink_packages("", 70000)


class _Broken:
    def __init__(self) -> None:
        self.calls = 0

    def window(self, window: Window) -> None:
        self.calls += 1
        raise OSError("disk full")

    def values(self, step: int, values: dict[str, float]) -> None: ...

    def event(self, step: int, kind: str, message: str, value: float | None = None,
              threshold: float | None = None, rank: int = -1) -> None: ...

    def finish(self, status: str, summary: dict[str, Any]) -> None: ...


class _Keep(_Broken):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Any] = []

    def window(self, window: Window) -> None:
        self.seen.append(window.step)

    def finish(self, status: str, summary: dict[str, Any]) -> None:
        self.seen.append(status)


@pytest.mark.timeout(10)
def test_fanout_drops_a_failing_sink_and_keeps_the_others() -> None:
    broken, keep = _Broken(), _Keep()
    fan = Fanout(broken, None, keep)
    fan.window(_window(1, 1.0))
    fan.window(_window(2, 1.0))
    fan.finish("completed", {})
    assert broken.calls == 1
    assert keep.seen == [1, 2, "completed"]


@pytest.mark.timeout(30)
def test_open_sinks_by_settings(tmp_path: Path) -> None:
    assert open_sinks(tensorboard="", prometheus_port=-1, prometheus_host="127.0.0.1",
                      run_id="r", run_dir=tmp_path) == []
    pytest.importorskip("tensorboard")
    pytest.importorskip("prometheus_client")
    sinks = open_sinks(tensorboard="tb", prometheus_port=0, prometheus_host="127.0.0.1",
                       run_id="r", run_dir=tmp_path)
    try:
        assert [type(s).__name__ for s in sinks] == ["TensorBoardSink", "PrometheusSink"]
        assert sinks[0].log_dir == tmp_path / "tb"  # type: ignore[attr-defined]
    finally:
        Fanout(*sinks).finish("completed", {})
