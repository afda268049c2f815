"""The live dashboard's costs: update latency, first paint on a big store, training overhead.

    python benchmarks/dashboard.py latency    [--seconds 30]
    python benchmarks/dashboard.py firstpaint [--store /tmp/tandem-dash-big.db] [--repeats 5]
    python benchmarks/dashboard.py overhead   [--pairs 15] [--block 15] [--nproc 2] [--view curves]
    python benchmarks/dashboard.py afterwards STORE   # an overhead run's store, afterwards
                                              [--client chromium|remote] [--server-priority idle]

latency: 4 writer processes log 10 windows/s each through the trainer's StoreWriter; a
Chromium page shows one of the runs. Each commit's time is taken in the writer process
(right after SQLite's COMMIT returns) and compared with the time the page applied the
update that carried that window's loss row.

firstpaint: a store of 100 runs x 20 metrics x 10k steps (20 M rows, written once through
RunStore.log_metrics and kept). A fresh browser context loads the runs page and a run page;
the figures are Chromium's first-contentful-paint and the page's own `tandem:ready` mark
(every chart drawn with the store's data), both from navigation start.

overhead: one long real training run (examples/mnist1d_cnn.py, 2 processes by default: both
cores busy, the worst case for a neighbour) with a Chromium page open on it and closed in
alternating blocks, the order of each pair alternating; the open page is scrolled to its
curves (`--view top`: left at its header, where no chart is drawn); throughput of a block is samples
over the wall time between its first and last committed window; the server's CPU is its
process CPU time over the block. `--client remote` stands in for a page on another machine
(the usual way to watch a training host): the same requests as the page (its data, its
event stream read as it comes, its diagnosis paced as the page paces it) from this
process, nothing drawn here; the diagnosis's clock runs only while the page is open and
carries over from one open block to the next, so the open blocks hold the diagnosis's
share of a page left open (the data, loaded again at each opening, falls in the settle
time before the block). `--server-priority`: the server's CPU priority (idle, its
default; low; normal).
Needs the dev extra (playwright) and Debian's chromium.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from dashboard_viewer import RemoteViewer  # noqa: E402

from tandem.monitor.store import RunStore  # noqa: E402

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
NAMES = ["loss", "eval_loss", "accuracy", "samples_per_s", "tokens_per_s", "grad_norm", "lr",
         "update_ratio", "time/step", "time/data", "time/h2d", "time/forward",
         "time/backward", "time/optim", "time/compute", "mem/rss_bytes", "sys/cpu_percent",
         "sys/process_cpu_percent", "sys/net_bytes_per_s", "sys/disk_bytes_per_s"]


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)
    env.pop("TANDEM_DASHBOARD_TOKEN", None)
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(store: Path, priority: str = "idle") -> tuple[subprocess.Popen, str]:
    """`tandem dashboard` on `store` as its own process; (process, base URL)."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tandem.cli", "dashboard", "--store",
                             str(store), "--port", str(port), "--priority", priority], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()
    if "http://" not in line:
        raise RuntimeError(f"the dashboard did not start: {line}{proc.stdout.read()}")
    # keep reading what it prints: a full pipe would stall the server mid-measurement
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    return proc, f"http://127.0.0.1:{port}"


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def load_average() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min) / {five:.2f} (5 min) on {os.cpu_count()} cores"


# ---------------------------------------------------------------------- latency
def _writer(store: str, run_id: str, seconds: float, rate: float, out: str) -> None:
    """One 'training run': windows of realistic rows through the real StoreWriter."""
    import tandem.monitor.writer as writer_module

    commits: list[tuple[int, float]] = []
    queued: list[tuple[int, float]] = []

    class Timed(RunStore):  # the real store; the commit time is noted after COMMIT
        def log_metrics(self, run_id: str, rows: Any) -> int:
            rows = list(rows)
            n = super().log_metrics(run_id, rows)
            now = time.time()
            commits.extend((int(r[0]), now) for r in rows if r[2] == "loss")
            return n

    writer_module.RunStore = Timed  # type: ignore[misc]
    writer = writer_module.StoreWriter(store, run_id)
    start, step = time.monotonic(), 0
    while time.monotonic() - start < seconds:
        step += 10
        queued.append((step, time.time()))
        for name in NAMES:
            writer.metric(step, -1, name, 1.0 + 1.0 / step)
        for rank in range(2):
            for name in ("time/step", "straggler/score", "time/data", "mem/rss_bytes"):
                writer.metric(step, rank, name, 1.0 + rank * 0.01)
        time.sleep(max(0.0, start + step / 10 / rate - time.monotonic()))
    writer.close()
    Path(out).write_text(json.dumps({"commits": commits, "queued": queued}))


def latency(args: argparse.Namespace) -> None:
    from playwright.sync_api import sync_playwright

    tmp = Path(tempfile.mkdtemp(prefix="tandem-dash-lat-"))
    store = tmp / "tandem.db"
    ids = [f"writer-{i}" for i in range(4)]
    with RunStore(store) as s:
        for rid in ids:
            s.start_run(rid, rid, {}, {"strategy": "ddp"}, {"world_size": 2})
            s.log_metrics(rid, [(0, -1, name, 1.0, time.time()) for name in NAMES])
    proc, base = start_server(store)
    ctx = mp.get_context("spawn")
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            page = browser.new_page()
            page.goto(f"{base}/run/{ids[0]}")
            page.wait_for_selector("body[data-ready='1']")
            page.evaluate("tandem.charts.loss.box.scrollIntoView()")  # drawn when in view
            # When the loss chart is redrawn, which step is the last it shows?
            page.evaluate("""() => { window.seen = [];
              window.addEventListener('tandem:drawn', () => {
                const c = tandem.charts.loss;
                if (c) seen.push([Date.now() / 1000, c.u.data[0][c.u.data[0].length - 1]]); });
            }""")
            writers = [ctx.Process(target=_writer, args=(str(store), rid, args.seconds, 10.0,
                                                         str(tmp / f"{rid}.json")))
                       for rid in ids]
            for w in writers:
                w.start()
            for w in writers:
                w.join(args.seconds + 60)
            time.sleep(1.5)
            seen = page.evaluate("window.seen")
            browser.close()
    finally:
        stop(proc)
    record = json.loads((tmp / f"{ids[0]}.json").read_text())
    commits, queued = dict(record["commits"]), dict(record["queued"])
    lat, end_to_end = [], []
    for step, committed in commits.items():
        shown = next((t for t, top in seen if top >= step), None)
        if shown is not None:
            lat.append(shown - committed)
            end_to_end.append(shown - queued[step])
    missing = len(commits) - len(lat)
    print(f"latency: {len(lat)} windows of {ids[0]} (4 runs x 10 windows/s, "
          f"{len(NAMES) + 8} rows each), {missing} not shown")
    print(f"  commit -> page: p50 {pct(lat, 0.5) * 1000:.0f} ms, p95 {pct(lat, 0.95) * 1000:.0f}"
          f" ms, max {max(lat) * 1000:.0f} ms")
    print(f"  window logged -> page (adds the writer's {0.5:g} s batching): p50 "
          f"{pct(end_to_end, 0.5) * 1000:.0f} ms, p95 {pct(end_to_end, 0.95) * 1000:.0f} ms")
    print(f"  {load_average()}")


# ---------------------------------------------------------------------- first paint
def build_big(path: Path, runs: int, steps: int) -> None:
    """100 runs x 20 metrics x `steps` windows through RunStore.log_metrics (kept)."""
    marker = path.with_suffix(".done")
    if marker.exists() and path.exists():
        return
    path.unlink(missing_ok=True)
    t0 = time.time()
    with RunStore(path) as s:
        for r in range(runs):
            rid = f"big-{r:03d}"
            s.start_run(rid, f"big{r % 7}", {"train": {"steps": steps, "seed": r}},
                        {"strategy": "ddp"}, {"world_size": 2, "device": "cpu"})
            start = 1.7e9 + r * 3600
            rows = [(step, -1, name, 1.0 / (1 + step / 1000) + i, start + step * 0.05)
                    for step in range(1, steps + 1) for i, name in enumerate(NAMES)]
            for k in range(0, len(rows), 100_000):
                s.log_metrics(rid, rows[k:k + 100_000])
            s.finish_run(rid, "completed", {"steps": steps})
            if r % 10 == 9:
                print(f"  built {r + 1} runs in {time.time() - t0:.0f} s", flush=True)
    marker.write_text("ok")


def _timings(page: Any, url: str) -> dict[str, float]:
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", timeout=60_000)
    out = page.evaluate("""() => ({
      fcp: performance.getEntriesByName('first-contentful-paint')[0].startTime,
      ready: performance.getEntriesByName('tandem:ready')[0].startTime,
      response: performance.getEntriesByType('navigation')[0].responseEnd })""")
    if "/run/" in url:  # the diagnosis comes after the first paint, from its own request
        page.wait_for_selector("#findings .finding, #findings p", timeout=60_000)
        out["findings"] = page.evaluate("performance.now()")
    return out


def firstpaint(args: argparse.Namespace) -> None:
    from playwright.sync_api import sync_playwright

    store = Path(args.store)
    build_big(store, 100, 10_000)
    print(f"store: {store} ({store.stat().st_size / 2**30:.2f} GiB)")
    proc, base = start_server(store)
    out: dict[str, list[dict[str, float]]] = {"runs": [], "run": []}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            for i in range(args.repeats + 1):  # the first round warms the OS file cache
                for key, path in (("runs", "/runs"), ("run", f"/run/big-{(37 + i) % 100:03d}")):
                    context = browser.new_context(viewport={"width": 1400, "height": 900})
                    t = _timings(context.new_page(), base + path)
                    context.close()
                    if i:
                        out[key].append(t)
            browser.close()
    finally:
        stop(proc)
    for key, rows in out.items():
        def show(field: str, rows: list[dict[str, float]] = rows) -> str:
            vals = [r[field] for r in rows]
            return f"median {statistics.median(vals):.0f} ms, max {max(vals):.0f} ms"
        print(f"{key} page ({len(rows)} loads): server response {show('response')}; "
              f"first contentful paint {show('fcp')}; charts drawn {show('ready')}"
              + (f"; diagnosis shown {show('findings')}" if "findings" in rows[0] else ""))
    print(f"  {load_average()}")


# ---------------------------------------------------------------------- overhead
def _train(run_dir: Path, name: str, steps: int, nproc: int) -> subprocess.Popen:
    script = str(ROOT / "examples" / "mnist1d_cnn.py")
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
                 f"--nproc-per-node={nproc}", script] if nproc > 1 else [sys.executable, script])
    cmd = [*launcher, "--train.steps", str(steps), "--run.dir", str(run_dir),
           "--run.name", name, "--checkpoint.every", "0", "--checkpoint.at_end", "false",
           "--monitor.progress", "off", "--monitor.log_every", "10",
           "--train.eval_every", "0", "--train.target", ""]
    # stderr to a file: a pipe nobody reads while the run goes fills up and blocks it
    with (run_dir / f"{name}.log").open("w") as log:  # the child keeps its own copy
        return subprocess.Popen(cmd, env=_env(), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _live_run(base: str, name: str, proc: subprocess.Popen) -> str:
    import urllib.request

    while proc.poll() is None:
        with urllib.request.urlopen(base + "/api/runs", timeout=10) as resp:
            runs = json.loads(resp.read())["runs"]
        run = next((r for r in runs if r["name"] == name and r["status"] == "running"), None)
        if run is not None:
            return run["run_id"]
        time.sleep(0.1)
    raise RuntimeError(f"the run ended before it was live (log: {proc.args})")


def _windows(store: Path, run_id: str) -> list[tuple[int, float]]:
    """(step, time) of every logging window the run has committed."""
    with RunStore(store) as s:
        rows = s.metrics(run_id)
    return sorted({(int(r["step"]), float(r["time"])) for r in rows
                   if r["name"] == "samples_per_s"})


def _block_rate(windows: list[tuple[int, float]], start: float, end: float,
                batch: int) -> float | None:
    """Samples/s between the first and the last window closed inside [start, end]."""
    inside = [w for w in windows if start <= w[1] <= end]
    if len(inside) < 3:
        return None
    (s0, t0), (s1, t1) = inside[0], inside[-1]
    return (s1 - s0) * batch / (t1 - t0)


def overhead(args: argparse.Namespace) -> None:
    """Within one long run, a page open and closed in alternating blocks (AB, BA, ...).

    The treatment (a page open on the live run) can be applied and removed while the
    run goes, so the block, not the run, is the unit: every run-level source of noise
    (the processes' placement, their memory, the plan) is held fixed, and the order of
    each pair alternates so that a drift of the machine cancels across pairs. One ratio
    per pair (open over closed samples/s), a Student-t interval over the pairs."""
    import psutil
    from playwright.sync_api import sync_playwright

    from tandem.tune.stats import t_quantile

    run_dir = Path(tempfile.mkdtemp(prefix="tandem-dash-ovh-"))
    store = run_dir / "tandem.db"
    with RunStore(store):
        pass
    proc, base = start_server(store, args.server_priority)
    server = psutil.Process(proc.pid)
    train = _train(run_dir, "overhead", 10_000_000, args.nproc)
    blocks: list[tuple[str, float, float, float, float]] = []  # mode, start, end, cpu, page
    others: list[float] = []  # cores the rest of the machine used in each block
    asked: list[int] = []  # diagnoses the stand-in asked within each block
    received = diagnosed = 0  # messages the remote stand-in read, diagnoses it asked
    resume: dict[str, float] | None = None  # the stand-in page's diagnosis clock
    try:
        run_id = _live_run(base, "overhead", train)
        time.sleep(args.warmup)
        with contextlib.ExitStack() as stack:
            if args.client == "chromium":
                pw = stack.enter_context(sync_playwright())
                browser = pw.chromium.launch(executable_path="/usr/bin/chromium",
                                             args=CHROMIUM_ARGS)
                stack.callback(browser.close)
            for i in range(args.pairs):
                for mode in (("closed", "open") if i % 2 == 0 else ("open", "closed")):
                    page: Any = None
                    if mode == "open" and args.client == "remote":
                        page = RemoteViewer(base, run_id, resume)
                    elif mode == "open":
                        page = browser.new_page()
                        page.goto(f"{base}/run/{run_id}")
                        page.wait_for_selector("body[data-ready='1']")
                        if args.view == "curves":  # as a user watching the run sees it
                            page.evaluate("tandem.charts.loss.box.scrollIntoView()")
                    browser_proc = [p for p in psutil.Process().children(recursive=True)
                                    if "chrom" in _name(p)] if args.client == "chromium" \
                        else [psutil.Process()]  # the stand-in's requests: this process
                    time.sleep(args.settle)  # the switch itself is in neither block
                    cpu0, page0 = server.cpu_times(), _cpu(browser_proc)
                    mine0 = _cpu(_tree(train)) + _cpu([server, *browser_proc])
                    busy0 = _busy()
                    diag0 = getattr(page, "diagnoses", 0)
                    start = time.time()
                    time.sleep(args.block)
                    end = time.time()
                    cpu1, page1 = server.cpu_times(), _cpu(browser_proc)
                    others.append((_busy() - busy0 - _cpu(_tree(train))
                                   - _cpu([server, *browser_proc]) + mine0) / (end - start))
                    used = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
                    blocks.append((mode, start, end, used / (end - start),
                                   (page1 - page0) / (end - start)))
                    asked.append(getattr(page, "diagnoses", 0) - diag0)
                    if page is not None:
                        if isinstance(page, RemoteViewer):
                            received += page.messages
                            diagnosed += page.diagnoses
                            resume = page.close()
                        else:
                            page.close()
                    if train.poll() is not None:
                        raise RuntimeError(f"training ended: see {run_dir}/overhead.log")
                print(f"  pair {i + 1}/{args.pairs} done", flush=True)
    finally:
        if train.poll() is None:
            os.killpg(train.pid, 15)
            train.wait(60)
        stop(proc)
    windows = _windows(store, run_id)
    batch = 128  # examples/mnist1d_cnn.py's global batch (its recipe, not overridden above)
    rates = [(m, _block_rate(windows, a, b, batch), c, pc) for m, a, b, c, pc in blocks]
    logs: list[float] = []
    with_diag: list[bool] = []  # whether the pair's open block held a diagnosis
    for i in range(0, len(rates), 2):
        pair = {m: r for m, r, _, _ in rates[i:i + 2]}
        if pair.get("open") and pair.get("closed"):
            logs.append(math.log(pair["open"] / pair["closed"]))
            with_diag.append(sum(asked[i:i + 2]) > 0)
    (run_dir / "blocks.json").write_text(json.dumps(
        [{"mode": m, "start": a, "end": b, "samples_per_s": r, "server_cpu": c,
          "diagnoses": d, "other_cpu": o} for (m, a, b, c, _), (_, r, _, _), d, o
         in zip(blocks, rates, asked, others, strict=True)], indent=1))
    n = len(logs)
    mean = statistics.fmean(logs)
    half = t_quantile(0.975, n - 1) * statistics.stdev(logs) / math.sqrt(n)

    def change(values: list[float]) -> str:
        m = statistics.fmean(values)
        h = t_quantile(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
        return (f"{(math.exp(m) - 1) * 100:+.2f}% [{(math.exp(m - h) - 1) * 100:+.2f}%, "
                f"{(math.exp(m + h) - 1) * 100:+.2f}%]")
    closed = [r for m, r, _, _ in rates if m == "closed" and r]
    opened = [r for m, r, _, _ in rates if m == "open" and r]
    cpu = [c for m, _, c, _ in rates if m == "open"]
    idle_cpu = [c for m, _, c, _ in rates if m == "closed"]
    page_cpu = [pc for m, _, _, pc in rates if m == "open"]
    where = "another machine's page (stand-in)" if args.client == "remote" else \
        f"a Chromium page here, at its {args.view}"
    print(f"overhead: mnist1d_cnn, {args.nproc} process(es), log_every 10, one run, "
          f"{where}, server priority {args.server_priority}, "
          f"{n} pairs of {args.block:.0f}-s blocks (page open / closed, order alternating)")
    print(f"  samples/s closed median {statistics.median(closed):.0f}, open "
          f"{statistics.median(opened):.0f}; open/closed {math.exp(mean):.4f} "
          f"[{math.exp(mean - half):.4f}, {math.exp(mean + half):.4f}] (95%, t over pairs); "
          f"change {(math.exp(mean) - 1) * 100:+.2f}% [{(math.exp(mean - half) - 1) * 100:+.2f}%, "
          f"{(math.exp(mean + half) - 1) * 100:+.2f}%]")
    print(f"  server CPU, page open: median {statistics.median(cpu) * 100:.2f}% of one core "
          f"(max {max(cpu) * 100:.2f}%); page closed: median "
          f"{statistics.median(idle_cpu) * 100:.2f}%; "
          + ("the stand-in's requests" if args.client == "remote" else
             "Chromium (the page, on this machine)")
          + f" median {statistics.median(page_cpu) * 100:.1f}% of one core"
          + (f" ({received} stream messages read, {diagnosed} diagnoses asked)"
             if args.client == "remote" else ""))
    if any(with_diag):
        diag = [x for x, d in zip(logs, with_diag, strict=True) if d]
        steady = [x for x, d in zip(logs, with_diag, strict=True) if not d]
        print(f"  pairs whose open block held a diagnosis: {len(diag)}, each "
              + ", ".join(f"{(math.exp(x) - 1) * 100:+.1f}%" for x in diag)
              + (f"; the other {len(steady)} pairs (the stream alone): {change(steady)}"
                 if len(steady) > 2 else ""))
    half_n = len(closed) // 2
    print(f"  the rest of the machine (neither the run, the server nor the page): median "
          f"{statistics.median(others) * 100:.1f}%, max {max(others) * 100:.1f}% of one core; "
          f"closed blocks' samples/s, first half median "
          f"{statistics.median(closed[:half_n]):.0f}, second half "
          f"{statistics.median(closed[half_n:]):.0f}")
    print(f"  every block: {run_dir / 'blocks.json'}; the store afterwards: python "
          f"benchmarks/dashboard.py afterwards {store}")
    print(f"  {load_average()}")


def afterwards(args: argparse.Namespace) -> None:
    """What a finished overhead run's store says: its throughput minute by minute (did
    the training itself drift?), its compute time early and late, and what the Run
    page's diagnosis costs on its latest rows against every row (CPU seconds, 3 times)."""
    from tandem.dashboard import queries, view_run
    from tandem.dashboard.reader import connect_readonly

    conn = connect_readonly(Path(args.store))
    try:
        run = queries.run(conn, args.run) if args.run else None
        if run is None:
            ids = [r[0] for r in conn.execute("SELECT run_id FROM runs ORDER BY started")]
            if args.run or len(ids) != 1:
                raise SystemExit(f"afterwards: name one run with --run (the store has "
                                 f"{', '.join(ids) or 'none'})")
            run = queries.run(conn, ids[0])
        rows = queries.metric_rows(conn, run["run_id"], ["samples_per_s", "time/compute"])
        t0 = min(r[5] for r in rows)
        minutes: dict[str, dict[int, list[tuple[int, float, float]]]] = {}
        for _, step, rank, name, value, t in rows:
            if rank == -1 or name == "time/compute":  # compute: per rank; all ranks' mean
                minutes.setdefault(name, {}).setdefault(int((t - t0) // 60), []).append(
                    (step, t, value))
        batch = 128  # examples/mnist1d_cnn.py's global batch, as overhead's
        rate = {m: (w[-1][0] - w[0][0]) * batch / (w[-1][1] - w[0][1])
                for m, w in sorted(minutes["samples_per_s"].items()) if len(w) > 2}
        mid = statistics.median(rate.values())
        slow = [m for m, r in rate.items() if r < 0.7 * mid]
        print(f"afterwards: {run['run_id']}, {len(rate)} minutes; samples/s a minute: min "
              f"{min(rate.values()):,.0f}, median {mid:,.0f}, max {max(rate.values()):,.0f}; "
              + (f"{len(slow)} minutes under 70% of the median (minutes {slow[0]}-{slow[-1]}, "
                 f"{min(rate[m] for m in slow):,.0f}-{max(rate[m] for m in slow):,.0f})"
                 if slow else "no minute under 70% of the median"))
        compute = {m: statistics.fmean(v for _, _, v in w)
                   for m, w in sorted(minutes["time/compute"].items())}
        keys = list(compute)
        print(f"  time/compute a step (mean over ranks): first 5 minutes "
              f"{statistics.median(compute[m] for m in keys[:5]) * 1000:.1f} ms, last 5 "
              f"{statistics.median(compute[m] for m in keys[-5:]) * 1000:.1f} ms")
        for label, read in (("its latest rows (a live page)", view_run.latest_rows),
                            ("every row (a finished run)", None)):
            costs, n = [], 0
            for _ in range(3):
                began = time.thread_time()
                got = read(conn, run["run_id"]) if read else None
                got = got if got is not None else queries.metric_rows(conn, run["run_id"])
                view_run.diagnose_rows(conn, run, got)
                costs.append(time.thread_time() - began)
                n = len(got)
            print(f"  diagnosis over {label}: {n:,} rows, "
                  + ", ".join(f"{c:.2f}" for c in costs) + " s of CPU")
    finally:
        conn.close()


def _name(process: Any) -> str:
    """A process's name in lower case ("" once it has exited: Chromium's helpers come and
    go while the page is open)."""
    import psutil

    try:
        return process.name().lower()
    except psutil.Error:
        return ""


def _tree(proc: subprocess.Popen) -> list[Any]:
    """The process `proc` started and every descendant it has now."""
    import psutil

    try:
        root = psutil.Process(proc.pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _busy() -> float:
    """CPU seconds the whole machine spent busy since boot: all but idle and iowait, and
    steal counted (a neighbour's use of this machine's cores); guest time is in user."""
    import psutil

    t = psutil.cpu_times()._asdict()
    return sum(t.values()) - sum(t.get(k, 0.0) for k in ("idle", "iowait", "guest", "guest_nice"))


def _cpu(processes: list[Any]) -> float:
    """CPU seconds of `processes` (those gone count as 0)."""
    import psutil

    total = 0.0
    for p in processes:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="part", required=True)
    lat = sub.add_parser("latency")
    lat.add_argument("--seconds", type=float, default=30.0)
    fp = sub.add_parser("firstpaint")
    fp.add_argument("--store", default="/tmp/tandem-dash-big.db")
    fp.add_argument("--repeats", type=int, default=5)
    ov = sub.add_parser("overhead")
    ov.add_argument("--pairs", type=int, default=15)
    ov.add_argument("--block", type=float, default=15.0, help="seconds of each block")
    ov.add_argument("--settle", type=float, default=2.0,
                    help="seconds after each switch that count in neither block")
    ov.add_argument("--warmup", type=float, default=10.0)
    ov.add_argument("--nproc", type=int, default=2)
    ov.add_argument("--view", choices=("curves", "top"), default="curves",
                    help="where the open page is scrolled: its curves (drawn live) or its "
                         "top (header and diagnosis; the charts below are not drawn)")
    ov.add_argument("--client", choices=("chromium", "remote"), default="chromium",
                    help="chromium: a page in Chromium on this machine; remote: the page's "
                         "requests only, as from a browser on another machine")
    ov.add_argument("--server-priority", default="idle", choices=("idle", "low", "normal"),
                    help="the dashboard server's CPU priority")
    aw = sub.add_parser("afterwards", help="what an overhead run's store says, afterwards")
    aw.add_argument("store", help="the run's tandem.db (overhead prints its directory)")
    aw.add_argument("--run", default="", help="run id (needed when the store holds several)")
    args = parser.parse_args()
    if args.part == "overhead" and args.pairs < 2:
        parser.error("overhead: --pairs must be at least 2 (an interval needs two pairs)")
    {"latency": latency, "firstpaint": firstpaint, "overhead": overhead,
     "afterwards": afterwards}[args.part](args)


if __name__ == "__main__":
    main()
