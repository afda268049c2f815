"""The shared-memory all-reduce against gloo's, on 2 CPU processes of this host.

    python benchmarks/host_allreduce.py [--nproc 2] [--pairs 3] [--steps 600]

One `torchrun --standalone` job. First the link calibration's own probe
(`monitor.calibrate.link_cost`) through each path, at MNIST-1D's gradient size (0.25 MB)
and at 4 MB: latency, bandwidth and what one buffer costs. Then DDP training steps of
the MNIST-1D CNN (AdamW, micro-batch 64 per process) with gloo's all-reduce and with the
shared-memory hook, in alternating order over `--pairs` pairs in the same processes:
milliseconds per step, the ratio of each pair, and whether the two paths end on the same
weights (each pair starts both from the same weights and batches).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    sys.path.insert(0, str(ROOT / "examples"))
    from mnist1d_model import make_model

    from tandem.monitor.calibrate import link_cost
    from tandem.parallel import hooks
    from tandem.parallel.host_allreduce import SharedMemoryGroup

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    host = SharedMemoryGroup(None, 4 << 20, 60.0)
    lines = []
    for nbytes in (252_200, 4_000_000):
        for name, fn in (("gloo", dist.all_reduce), ("shared memory", host.all_reduce)):
            got = [link_cost(nbytes, torch.device("cpu"), repeats=7, all_reduce=fn)
                   for _ in range(5)]
            lat = statistics.median(g["comm/latency_s"] for g in got)
            rate = statistics.median(g["comm/allreduce_bytes_per_s"] for g in got)
            lines.append(f"| {name} | {nbytes / 1e6:.2f} MB | {lat * 1e6:.1f} us | "
                         f"{rate / 1e9:.2f} GB/s | {(lat + nbytes / rate) * 1e6:.0f} us |")
    gen = torch.Generator().manual_seed(rank)
    xs = torch.randn(args.steps + 20, 64, 1, 40, generator=gen)
    ys = torch.randint(0, 10, (args.steps + 20, 64), generator=gen)

    def train(shared: bool) -> tuple[float, torch.Tensor]:
        torch.manual_seed(0)
        ddp = DistributedDataParallel(make_model(), gradient_as_bucket_view=True)
        hooks.register(ddp, "none", backend="gloo", host=host if shared else None)
        opt = torch.optim.AdamW(ddp.parameters(), 3e-3)

        def step(i: int) -> None:
            torch.nn.functional.cross_entropy(ddp(xs[i]), ys[i]).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        for i in range(20):
            step(i)
        dist.barrier()
        started = time.perf_counter()
        for i in range(args.steps):
            step(20 + i)
        dist.barrier()
        per = (time.perf_counter() - started) / args.steps
        return per, torch.cat([q.detach().flatten() for q in ddp.module.parameters()])

    rows = []
    for pair in range(args.pairs):
        order = (False, True) if pair % 2 == 0 else (True, False)
        got = {shared: train(shared) for shared in order}
        rows.append((got[False][0], got[True][0], torch.equal(got[False][1], got[True][1])))
    if rank == 0:
        print(f"link probe, {world} processes (median of 5 probes of 7 pairs)\n")
        print("| path | buffer | latency | bandwidth (buffer bytes) | one buffer |")
        print("| --- | --- | --- | --- | --- |")
        print("\n".join(lines))
        print(f"\nDDP steps, MNIST-1D CNN, AdamW, {world} processes, {args.steps} steps "
              f"each, {args.pairs} pairs (order alternating)\n")
        print("| pair | gloo ms/step | shared memory ms/step | gloo / shared | same weights |")
        print("| --- | --- | --- | --- | --- |")
        for i, (g, s, same) in enumerate(rows):
            print(f"| {i + 1} | {g * 1e3:.2f} | {s * 1e3:.2f} | {g / s:.3f} | {same} |")
        ratios = [g / s for g, s, _ in rows]
        print(f"\nmedian gloo / shared memory: {statistics.median(ratios):.3f} "
              f"[{min(ratios):.3f}-{max(ratios):.3f}]; load {os.getloadavg()[0]:.2f}")
    host.close()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                       os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={args.nproc}", __file__, "--worker",
           f"--pairs={args.pairs}", f"--steps={args.steps}"]
    sys.exit(subprocess.run(cmd, env=env, timeout=1200).returncode)


if __name__ == "__main__":
    main()
