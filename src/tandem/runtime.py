"""The process's place in the job: launch environment, process group, device, seeding."""

from __future__ import annotations

import ctypes
import gc
import hashlib
import logging
import os
import random
import socket
import sys
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from tandem.config import PlanConfig

log = logging.getLogger("tandem")


@dataclass(frozen=True, kw_only=True)
class Runtime:
    """Where this process stands: rank, world, device, launch kind."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    device: torch.device
    launcher: str  # "plain" or "torchrun"
    restart_count: int
    owns_group: bool
    store: dist.Store | None = None  # the group's key-value store (liveness records)
    flushes_denormals: bool = False  # set by `start` (plan.flush_denormal), undone by `stop`

    @property
    def distributed(self) -> bool:
        """True when more than one process takes part."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """True on the rank that writes run records and prints."""
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value is None or value == "" else int(value)


def _pick_device(plan: PlanConfig, local_rank: int) -> torch.device:
    want = plan.device
    if want == "cuda" and not torch.cuda.is_available():
        raise ValueError("plan.device: 'cuda' was asked for but no CUDA device is available")
    if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def _backend(plan: PlanConfig, device: torch.device) -> str:
    if plan.backend == "nccl" and device.type != "cuda":
        raise ValueError("plan.backend: 'nccl' needs CUDA devices; use 'gloo' or 'auto' on CPU")
    if plan.backend != "auto":
        return plan.backend
    return "nccl" if device.type == "cuda" else "gloo"


_GROUPS_STARTED = 0  # process groups this process has created (all ranks count alike)
_STORES: dict[tuple, dist.TCPStore] = {}


def _attempt_store(rank: int, world_size: int, timeout: timedelta) -> dist.Store:
    """A store whose keys are private to this restart attempt of the group.

    Under torchrun the workers of every attempt share the agent's TCPStore; without a
    per-attempt prefix a restarted group can read the dead attempt's addresses and fail
    to connect (or hang). Prefixing the keys by the restart count keeps attempts apart.
    """
    host = os.environ["MASTER_ADDR"]
    port = int(os.environ["MASTER_PORT"])
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    # One store per process and address, reused by later groups: a second server on the
    # port would race the first one's shutdown, and a client could reach the old one.
    key = (host, port, world_size, rank, agent_store)
    store = _STORES.get(key)
    if store is None:
        is_master = (not agent_store) and rank == 0
        store = _STORES[key] = dist.TCPStore(
            host_name=host,
            port=port,
            world_size=world_size,
            is_master=is_master,
            timeout=timeout,
            wait_for_workers=False,
            **_loopback_listener(host, port, is_master),
        )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    # A process may also run several groups one after another (fit called twice): each
    # gets its own keys too, or a later group can read an earlier one's addresses.
    global _GROUPS_STARTED
    _GROUPS_STARTED += 1
    return dist.PrefixStore(f"tandem/attempt{attempt}/group{_GROUPS_STARTED}", store)


def _loopback_listener(host: str, port: int, is_master: bool) -> dict[str, int]:
    """A loopback store's server socket, bound to the loopback address only.

    TCPStore's server listens on every interface whatever its host name; a one-node
    group (MASTER_ADDR 127.x, as tandem's own agent sets it) needs no other, so rank 0
    binds the socket itself and hands it over. Other groups keep TCPStore's own.
    """
    if not (is_master and host.startswith("127.")):
        return {}
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return {"master_listen_fd": sock.detach()}


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)


def tune_host_allocator(threshold_mb: float) -> bool:
    """Let glibc keep freed host blocks up to `threshold_mb` for reuse. Returns whether set.

    glibc maps blocks above its mmap threshold (128 KiB at first, raised only after such
    a block is freed) straight from the kernel and unmaps them on free, so every step's
    activations and gradients of that size are page-faulted in again, which slowed the
    MNIST-1D example's forward pass (docs/benchmarks.md, the peers) until something
    happened to raise the threshold. A fixed threshold (and a trim threshold twice as
    high) ends it. Skipped off Linux, off glibc, for 0, and when MALLOC_MMAP_THRESHOLD_
    is set.
    """
    if threshold_mb <= 0 or not sys.platform.startswith("linux"):
        return False
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    size = int(threshold_mb * 2**20)
    return bool(mallopt(_M_MMAP_THRESHOLD, size)) and bool(mallopt(_M_TRIM_THRESHOLD, 2 * size))


def flush_denormals(on: bool) -> bool:
    """Have this thread's CPU arithmetic treat subnormal floats as zero (FTZ and DAZ), or
    not. Returns whether the CPU could (torch.set_flush_denormal: x86 with SSE3, ARM).

    A float below 1.2e-38 is computed in microcode on x86, tens of times slower. A long
    run meets them once the model has fitted its data: the softmax gives the wrong
    classes probabilities below 1e-38 and the backward pass carries them: a long run of
    the MNIST-1D example slowed several-fold that way (`benchmarks/denormal.py`, figures
    in docs/benchmarks.md). The flag is the thread's own (MXCSR on x86): threads
    started after it is set inherit it (torch's intra-op pool when it is made later); a
    pool that already runs keeps its own. `tandem run` gives each process one thread,
    where all of the arithmetic of the step is on the thread that sets it.
    """
    return bool(torch.set_flush_denormal(on))


def start(plan: PlanConfig) -> Runtime:
    """Detect the launch, initialise the process group when needed, pick the device.

    Must be called on all processes. A process group that already exists (the user
    made one) is reused and left for the user to destroy.
    """
    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else "plain"
    if world_size > 1 and "MASTER_ADDR" not in os.environ:
        raise ValueError(
            f"WORLD_SIZE={world_size} but MASTER_ADDR is not set; launch with "
            "`tandem run --nproc-per-node N script.py` or torchrun"
        )
    tune_host_allocator(plan.malloc_threshold_mb)
    flushes = plan.flush_denormal and flush_denormals(True)  # before the intra-op pool starts
    if plan.threads > 0:
        torch.set_num_threads(plan.threads)
    device = _pick_device(plan, local_rank)
    _backend(plan, device)  # a backend that cannot serve this device is refused at any size
    owns_group = False
    store = None
    if world_size > 1 and not dist.is_initialized():
        timeout = timedelta(seconds=plan.timeout_s)
        store = _attempt_store(rank, world_size, timeout)
        dist.init_process_group(
            backend=_backend(plan, device),
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=timeout,
            device_id=device if device.type == "cuda" else None,
        )
        owns_group = True
    elif dist.is_initialized():
        rank, world_size = dist.get_rank(), dist.get_world_size()
    return Runtime(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=_env_int("LOCAL_WORLD_SIZE", 1),
        node_rank=_env_int("GROUP_RANK", 0),
        device=device,
        launcher=launcher,
        restart_count=_env_int("TORCHELASTIC_RESTART_COUNT", 0),
        owns_group=owns_group,
        store=store,
        flushes_denormals=flushes,
    )


def stop(runtime: Runtime, clean: bool = True) -> None:
    """Destroy the process group that `start` created (not one the user made).

    `clean`: all ranks stop together, so a barrier comes first: destroying a gloo group
    while its worker thread still finishes an earlier collective can deadlock on the
    GIL (seen with torch 2.13). After a failure on this rank alone there is no barrier
    (the others may wait in another collective until the timeout).

    Subnormals are computed again, as torch does by default, if `start` had them flushed.
    """
    if runtime.flushes_denormals:
        flush_denormals(False)
    if runtime.owns_group and dist.is_initialized():
        if clean:
            dist.barrier()
        # FSDP2 modules hold their group in reference cycles; freed only at exit, after
        # the group is gone, gloo sometimes aborts the process. Free them now.
        gc.collect()
        dist.destroy_process_group()


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed that depends only on `parts` (stable across Python runs)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def seed_step(seed: int, rank: int, step: int) -> None:
    """Seed torch, numpy and random for one step of one rank.

    Every RNG is a pure function of (seed, rank, step), so a resumed run draws exactly
    what the uninterrupted run drew, whatever the restart history: no RNG state needs
    to be checkpointed or resharded.
    """
    seed_all(derive_seed("step", seed, rank, step))


def seed_all(value: int) -> None:
    """Seed torch, numpy and random with one value.

    Called every step: torch.manual_seed visits every device type's generators, too
    costly for every step, so the CPU generator is seeded directly and CUDA's only once
    CUDA is in use (both are what torch.manual_seed would seed here).
    """
    torch.default_generator.manual_seed(value)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(value)
    random.seed(value)
    np.random.seed(value & 0xFFFFFFFF)
