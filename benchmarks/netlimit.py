"""Time-to-accuracy over a slow link: two nodes in network namespaces joined by a shaped veth.

    sudo .venv/bin/python benchmarks/netlimit.py [--rate 100mbit] [--delay 20ms]
        [--steps 300] [--target 0.95] [--hidden 1024] [--baseline ddp]
        [--plans ddp fp16 powersgd localsgd diloco streaming nocomm]

Needs root (it creates network namespaces). Two namespaces, each one "node" with one
tandem process, are joined by a veth pair whose two ends are shaped with tc (a token
bucket, `tbf rate RATE burst BURST latency 50ms`, on both ends: each direction is
limited); `--delay` puts a netem delay in front of each end's tbf (each direction
waits that long). The nodes talk over 10.77.0.1/24 - 10.77.0.2/24 only (GLOO_SOCKET_IFNAME is
the veth end, `lo` is up in each namespace), so every collective crosses the link:

    ns A: tandem run --nnodes 2 --nproc-per-node 1 --node-rank 0 --rdzv-backend static \\
              --rdzv-endpoint 10.77.0.1:29400 benchmarks/wide_mnist1d.py ...
    ns B: the same with --node-rank 1

The rendezvous is torchrun's static one (node 0 hosts the store): the c10d backend
decides which node hosts its store by comparing the endpoint with the machine's host
name, which inside a namespace resolves to an address the namespace does not have, so
under c10d both nodes wait for a store that nobody serves.

The task is MNIST-1D on the wide model of `benchmarks/wide_mnist1d.py` (hidden width
`--hidden`, 1.1 M parameters at 1024: 4.4 MB of fp32 gradients a step); each plan
trains the same recipe for `--steps` steps, evaluating every 25, and the figure is the
run time at which the test accuracy first reaches `--target` (tandem's
`time_to_target_s`). Calibration is off (`monitor.calibrate_at 0`) for every plan: it
times extra all-reduces, which over a slow link would charge DDP for a measurement
(DDP's `comm/bytes_per_step` comes from the gradient sizes, without calibration).
PowerSGD runs at rank 16 by default, the rank at which it kept fp32's accuracy on
this model in `benchmarks/comm.py`. `streaming` is streaming DiLoCo (`--fragments`,
`--overlap-steps`, `--outer-dtype`; the same H as localsgd/diloco); `nocomm` is the
no-communication control: local SGD whose replicas meet only once, after the last step
(its throughput is the ceiling a low-communication plan can reach; its accuracy is one
replica trained on half the data, not a contender's). Ratios in the table are against
`--baseline` (ddp by default) for the time to target and against nocomm, when it ran,
for the throughput.

The limit is checked, not assumed: before the runs a TCP transfer of a known size
crosses the link in each direction, and for every run the bytes the two qdiscs sent
(`tc -s qdisc`, headers included) are compared with the bytes tandem says it sent.
Namespaces and links are removed at the end, on error and on Ctrl-C.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import (  # noqa: E402
    QUIET,
    WIDE_MNIST1D,
    child_env,
    mib,
    steady,
    summary,
    table,
    tandem_command,
    window_values,
)

ADDRESSES = ("10.77.0.1", "10.77.0.2")
NAN = float("nan")
RDZV_PORT = 29400
PROBE_PORT = 29450

PLANS: dict[str, dict[str, str]] = {
    "ddp": {"plan.strategy": "ddp", "plan.comm_hook": "none"},
    "fp16": {"plan.strategy": "ddp", "plan.comm_hook": "fp16"},
    "powersgd": {"plan.strategy": "ddp", "plan.comm_hook": "powersgd"},
    "localsgd": {"plan.strategy": "localsgd"},
    "diloco": {"plan.strategy": "diloco"},
    "streaming": {"plan.strategy": "streaming_diloco"},
    "nocomm": {"plan.strategy": "localsgd"},
}

_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bps": 8, "kbps": 8e3,
          "mbps": 8e6, "gbps": 8e9}


def rate_bits(rate: str) -> float:
    """A tc rate ('100mbit', '1gbit', '12mbps') in bits per second."""
    match = re.fullmatch(r"([0-9.]+)\s*([a-z]+)", rate.strip().lower())
    if not match or match.group(2) not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"--rate {rate!r}: write a number and one of {sorted(_UNITS)}, e.g. 100mbit")
    return float(match.group(1)) * _UNITS[match.group(2)]


def sh(cmd: Sequence[str], timeout: float = 30.0) -> str:
    """Run a short system command; raise with its message when it fails."""
    done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()}")
    return done.stdout


class Link:
    """Two network namespaces joined by a veth pair, each end shaped with tc."""

    def __init__(self, rate: str, burst: str, latency: str, delay: str = "") -> None:
        tag = f"{os.getpid() % 100000}"
        self.ns = (f"tandem-a{tag}", f"tandem-b{tag}")
        self.dev = (f"tdm{tag}a", f"tdm{tag}b")  # interface names: 15 characters at most
        self.rate, self.burst, self.latency, self.delay = rate, burst, latency, delay
        self.created: list[str] = []

    def up(self) -> None:
        """Create the namespaces, the link, the addresses and the shaping."""
        for ns in self.ns:
            sh(["ip", "netns", "add", ns])
            self.created.append(ns)
        sh(["ip", "link", "add", self.dev[0], "type", "veth", "peer", "name", self.dev[1]])
        for ns, dev, address in zip(self.ns, self.dev, ADDRESSES, strict=True):
            sh(["ip", "link", "set", dev, "netns", ns])
            sh(["ip", "-n", ns, "addr", "add", f"{address}/24", "dev", dev])
            sh(["ip", "-n", ns, "link", "set", dev, "up"])
            sh(["ip", "-n", ns, "link", "set", "lo", "up"])
            tc = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev]
            parent = ["root"]
            if self.delay:
                try:
                    sh([*tc, "root", "handle", "1:", "netem", "delay", self.delay])
                except RuntimeError as err:
                    raise RuntimeError(f"--delay needs tc's netem qdisc (sch_netem), which "
                                       f"this kernel lacks: {err}") from None
                parent = ["parent", "1:", "handle", "2:"]
            sh([*tc, *parent, "tbf", "rate", self.rate, "burst", self.burst,
                "latency", self.latency])

    def down(self) -> None:
        """Remove the namespaces (which removes the veth pair with them)."""
        for ns in reversed(self.created):
            try:
                sh(["ip", "netns", "del", ns])
            except (RuntimeError, subprocess.TimeoutExpired) as err:
                print(f"warning: could not remove namespace {ns}: {err}", file=sys.stderr)
        self.created.clear()

    def sent_bytes(self) -> tuple[int, int]:
        """Bytes each end's qdisc has sent so far (A -> B, B -> A)."""
        counts = []
        for ns, dev in zip(self.ns, self.dev, strict=True):
            text = sh(["ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", dev])
            match = re.search(r"Sent (\d+) bytes", text)
            if match is None:
                raise RuntimeError(f"no byte count in tc -s qdisc output: {text!r}")
            counts.append(int(match.group(1)))
        return counts[0], counts[1]

    def exec_prefix(self, side: int) -> list[str]:
        """The command prefix that runs a command in namespace `side` (0: A, 1: B)."""
        return ["ip", "netns", "exec", self.ns[side]]


_PROBE_SERVER = """
import socket, sys
size = int(sys.argv[1])
with socket.create_server((sys.argv[2], int(sys.argv[3]))) as server:
    conn, _ = server.accept()
    with conn:
        got = 0
        while got < size:
            chunk = conn.recv(1 << 20)
            if not chunk:
                break
            got += len(chunk)
        conn.sendall(b"k")
"""

_PROBE_CLIENT = """
import socket, sys, time
size = int(sys.argv[1])
for _ in range(200):
    try:
        conn = socket.create_connection((sys.argv[2], int(sys.argv[3])), timeout=60)
        break
    except OSError:
        time.sleep(0.05)
payload = bytes(1 << 20)
start = time.perf_counter()
sent = 0
while sent < size:
    conn.sendall(payload[: min(len(payload), size - sent)])
    sent += min(len(payload), size - sent)
conn.recv(1)
print(time.perf_counter() - start)
"""


def probe(link: Link, sender: int, size: int, timeout: float) -> float:
    """Bits per second of a `size`-byte TCP transfer from namespace `sender` to the other."""
    receiver = 1 - sender
    host = ADDRESSES[receiver]
    server = subprocess.Popen([*link.exec_prefix(receiver), sys.executable, "-c",
                               _PROBE_SERVER, str(size), host, str(PROBE_PORT)])
    try:
        out = subprocess.run([*link.exec_prefix(sender), sys.executable, "-c", _PROBE_CLIENT,
                              str(size), host, str(PROBE_PORT)],
                             capture_output=True, text=True, timeout=timeout, check=True)
        server.wait(timeout=10)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=10)
    return size * 8 / float(out.stdout.strip())


def run_plan(link: Link, name: str, plan: dict[str, str], args: argparse.Namespace,
             out: Path, seed: int) -> dict[str, float]:
    """Train the task under `plan` with one node in each namespace; its figures."""
    flags = ["--train.steps", str(args.steps), "--train.eval_every", str(args.eval_every),
             "--train.target", f"accuracy>={args.target}", "--monitor.calibrate_at", "0",
             "--monitor.log_every", "25", *QUIET, "--run.dir", str(out),
             "--run.name", name, "--run.seed", str(seed)]
    for key, value in plan.items():
        flags += [f"--{key}", value]
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    before = link.sent_bytes()
    started = time.perf_counter()
    try:
        for side in (0, 1):
            launcher = ["--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(side),
                        "--rdzv-endpoint", f"{ADDRESSES[0]}:{RDZV_PORT}",
                        "--rdzv-backend", "static", "--rdzv-id", name]
            cmd = [*link.exec_prefix(side), *tandem_command(launcher, WIDE_MNIST1D, flags)]
            env = child_env({"GLOO_SOCKET_IFNAME": link.dev[side],
                             "WIDE_MNIST1D_HIDDEN": str(args.hidden)})
            log = (out / f"{name}.node{side}.log").open("wb")
            logs.append(log)
            # A session of its own: the whole node (launcher and worker) can be stopped.
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        deadline = time.monotonic() + args.timeout
        for side, proc in enumerate(procs):
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            if code:
                tail = (out / f"{name}.node{side}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name}: node {side} failed (exit {code}):\n{tail}")
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{name} ran past {args.timeout:.0f} s; logs in {out}") from None
    finally:
        for proc in procs:
            stop(proc)
        for log in logs:
            log.close()
    launch_s = time.perf_counter() - started
    after = link.sent_bytes()
    wire = sum(a - b for a, b in zip(after, before, strict=True)) / 2  # per node
    result = summary(out / name)
    store = out / "tandem.db"
    sent = window_values(store, name, "comm/bytes_per_step")
    reached = re.search(r"at step (\d+)", str(result.get("target", "")))
    return {
        "to_target_s": float(result.get("time_to_target_s", float("nan"))),
        "target_step": float(reached.group(1)) if reached else float("nan"),
        "accuracy": float(result.get("accuracy", float("nan"))),
        "wall_s": float(result["wall_time_s"]),
        "step_s": steady(window_values(store, name, "time/step")),
        "tandem_bytes": steady(sent) if plan.get("plan.strategy") == "ddp" else (
            sum(sent) / len(sent) if sent else float("nan")),
        "wire_bytes": wire / args.steps,
        "launch_s": launch_s,
        "peak_sync": max(window_values(store, name, "comm/peak_bytes_per_sync"),
                         default=float("nan")),
        "overlap": statistics.fmean(window_values(store, name, "comm/overlap") or [NAN]),
    }


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End a node this benchmark started (its own session) if it is still running."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@contextmanager
def interrupts_raise() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt so that the clean-up runs on it too."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="100mbit", help="tc rate of each direction")
    parser.add_argument("--burst", default="32kbit", help="tc tbf burst")
    parser.add_argument("--latency", default="50ms", help="tc tbf latency (queue bound)")
    parser.add_argument("--delay", default="", help="netem delay of each direction, e.g. "
                        "20ms (default: none)")
    parser.add_argument("--plans", nargs="+", default=list(PLANS), choices=list(PLANS))
    parser.add_argument("--baseline", default="ddp", choices=list(PLANS),
                        help="the plan the times to target are compared with")
    parser.add_argument("--sync-every", type=int, default=8,
                        help="localsgd/diloco/streaming H")
    parser.add_argument("--fragments", type=int, default=4, help="streaming: P")
    parser.add_argument("--overlap-steps", type=int, default=1, help="streaming: tau")
    parser.add_argument("--outer-dtype", default="fp32", help="streaming: outer gradients")
    parser.add_argument("--powersgd-rank", type=int, default=16,
                        help="16: rank 2 (tandem's default) ends ~3 points below fp32 on this "
                             "model (benchmarks/comm.py)")
    parser.add_argument("--powersgd-warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--target", type=float, default=0.90,
                        help="test accuracy goal (one that every plan reaches in --steps)")
    parser.add_argument("--hidden", type=int, default=1024, help="wide model's hidden width")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--probe-mb", type=float, default=0.0,
                        help="size of the TCP check of the limit (default: 2 s at --rate)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--out", default="", help="keep runs and node logs here")
    args = parser.parse_args()
    bits = rate_bits(args.rate)
    if os.geteuid() != 0:
        print("netlimit.py must run as root: it creates network namespaces, a veth pair "
              "and tc qdiscs (try: sudo .venv/bin/python benchmarks/netlimit.py)",
              file=sys.stderr)
        return 2
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        print(f"netlimit.py needs {' and '.join(missing)} (iproute2)", file=sys.stderr)
        return 2
    for plan in ("localsgd", "diloco", "streaming"):
        PLANS[plan]["plan.sync_every"] = str(args.sync_every)
    PLANS["streaming"].update({"plan.fragments": str(args.fragments),
                               "plan.overlap_steps": str(args.overlap_steps),
                               "plan.outer_dtype": args.outer_dtype})
    PLANS["nocomm"]["plan.sync_every"] = str(args.steps + 1)
    PLANS["powersgd"].update({"plan.powersgd_rank": str(args.powersgd_rank),
                              "plan.powersgd_warmup": str(args.powersgd_warmup)})
    names = [args.baseline, *(p for p in args.plans if p != args.baseline)]
    link = Link(args.rate, args.burst, args.latency, args.delay)
    results: dict[tuple[str, int], dict[str, float]] = {}
    began = time.perf_counter()
    with interrupts_raise(), tempfile.TemporaryDirectory(prefix="tandem-netlimit-") as tmp:
        out = Path(args.out).resolve() if args.out else Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        try:
            link.up()
            size = int(args.probe_mb * 1e6) or int(bits / 8 * 2)
            measured = [probe(link, side, size, timeout=120) for side in (0, 1)]
            print(f"link: tbf rate {args.rate} burst {args.burst} latency {args.latency} "
                  f"{'netem delay ' + args.delay + ' ' if args.delay else ''}"
                  f"on {link.dev[0]} / {link.dev[1]}; TCP {size / 1e6:.1f} MB A->B "
                  f"{measured[0] / 1e6:.1f} Mbit/s, B->A {measured[1] / 1e6:.1f} Mbit/s "
                  f"(limit {bits / 1e6:.1f})", flush=True)
            for i in range(args.repeats):
                for plan in names:
                    run_name = f"net-{plan}-{i}-{int(time.time())}"
                    got = run_plan(link, run_name, PLANS[plan], args, out, i)
                    results[(plan, i)] = got
                    print(f"{plan:9s} seed {i}: target at {got['to_target_s']:.1f} s "
                          f"(step {got['target_step']:.0f}), accuracy {got['accuracy']:.4f}, "
                          f"{got['step_s'] * 1e3:.0f} ms/step, wire {mib(got['wire_bytes'])} "
                          f"MiB/step/node, tandem {mib(got['tandem_bytes'])}, peak sync "
                          f"{mib(got['peak_sync'])} MiB, overlap {got['overlap']:.2f}; run "
                          f"{got['wall_s']:.1f} s, launch to exit {got['launch_s']:.1f} s",
                          flush=True)
        finally:
            link.down()
    print(f"\n{args.rate} link (measured {min(measured) / 1e6:.1f} Mbit/s), MNIST-1D wide "
          f"(hidden {args.hidden}), {args.steps} steps, target accuracy {args.target}, "
          f"{args.repeats} repeat(s); total {time.perf_counter() - began:.0f} s\n")
    print(report(names, results, args.repeats, args.baseline))
    return 0


def report(names: list[str], results: dict[tuple[str, int], dict[str, float]],
           repeats: int, baseline: str) -> str:
    """Medians over repeats (a run that missed the target counts as never reaching it);
    the time to target against `baseline` and the throughput against the
    no-communication control (when it ran) as per-seed ratios (the plans of one seed ran
    one after another): median [lowest, highest]."""

    def values(plan: str, key: str) -> list[float]:
        return [results[(plan, i)][key] for i in range(repeats)]

    def med(plan: str, key: str) -> float:
        got = sorted(math.inf if v != v else v for v in values(plan, key))
        return got[len(got) // 2]

    def ratios(top: str, key: str, plan: str) -> str:
        kept = sorted(t / v for t, v in zip(values(top, key), values(plan, key), strict=True)
                      if t == t and v == v)
        if not kept:
            return "-"
        return f"{kept[len(kept) // 2]:.2f} [{kept[0]:.2f}, {kept[-1]:.2f}]"

    rows = []
    for plan in names:
        reach = med(plan, "to_target_s")
        reached = sum(v == v for v in values(plan, "to_target_s"))
        overlap = med(plan, "overlap")
        rows.append([
            plan, f"{reached}/{repeats}", "never" if reach == math.inf else f"{reach:.1f}",
            ratios(baseline, "to_target_s", plan),
            f"{med(plan, 'accuracy') * 100:.2f}", f"{med(plan, 'step_s') * 1e3:.0f}",
            ratios("nocomm", "step_s", plan) if "nocomm" in names else "-",
            mib(med(plan, "wire_bytes")), mib(med(plan, "peak_sync")),
            "-" if overlap == math.inf else f"{overlap:.2f}"])
    return table(["plan", "reached", "to target s", f"x sooner than {baseline}",
                  "final acc %", "step ms", "throughput / nocomm", "wire MiB/step/node",
                  "peak MiB/sync", "overlap"], rows)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; the namespaces were removed", file=sys.stderr)
        sys.exit(130)
