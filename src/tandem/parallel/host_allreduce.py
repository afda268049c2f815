"""Gradient all-reduce (and all-gather) through shared memory, for CPU processes that
share one host.

Between processes on one machine, gloo's all-reduce goes through the loopback network:
each bucket is cut into messages, sent over sockets and woken up on by a thread. Here
every process instead writes its bucket into its own slot of one shared segment, says so
by raising its counter, waits until every peer's counter has reached the same round, and
sums the slots itself, in rank order: every process computes the same sum from the same
numbers, so the replicas stay identical bit for bit.

Rounds alternate between two sets of slots: a process that starts round g + 2 has seen
every peer finish round g + 1, so no peer still reads the slots of round g it overwrites.
The counters are single-writer, and the writer's stores (the slot, then the counter) are
seen in that order on x86-64 (total store order, with a locked instruction between them
for copies that use non-temporal stores); other architectures keep the backend's
all-reduce. A peer that dies is seen by its process id while the others wait, and a
wait longer than the collective timeout raises, naming who did not arrive (both as
`DistBackendError`, what a failed collective of the process group raises).

The segment is a file in /dev/shm, removed as soon as every process has mapped it (the
mappings outlive the name), so a crash leaves nothing behind. Whether every process
really shares it is tested, not assumed: rank 0 writes a random word, every process
reads it back, and all agree by one all-reduce, or all keep the backend's all-reduce.
"""

# No `from __future__ import annotations`: DDP's register_comm_hook compares the hook's
# annotations with the real `dist.GradBucket` and `Future[Tensor]` types.

import mmap
import os
import platform
import secrets
import shutil
import struct
import threading
import time

import torch
import torch.distributed as dist

from tandem.pids import alive

SHM_DIR = "/dev/shm"
LINE = 64  # bytes: one cache line per process's counter and pid, and slot alignment
SPIN_S = 2e-3  # wait by polling this long, then by short sleeps (the core is given up)
NAP_S = 20e-6
SLOT_MAX_BYTES = 4 << 20  # larger buckets go through in pieces of this size
PEER_CHECK_S = 0.05  # while waiting, look this often whether the missing peers are alive


def slot_bytes(params: list[torch.Tensor], group: dist.ProcessGroup | None) -> int:
    """A slot's size for these gradients: all of them, at most SLOT_MAX_BYTES, and at most
    what keeps the segment within half of the free space of /dev/shm."""
    total = sum(q.numel() * q.element_size() for q in params)
    budget = shutil.disk_usage(SHM_DIR).free // (4 * dist.get_world_size(group))
    return max(LINE, min(total, SLOT_MAX_BYTES, budget))


def unsupported(device: torch.device) -> str | None:
    """Why this machine cannot use the shared-memory all-reduce (None: it can try)."""
    if device.type != "cpu":
        return f"gradients live on {device.type}, not on the CPU"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return (f"the host is {platform.machine()}; the counters' ordering is proven for "
                "x86-64 (total store order) only")
    if not os.path.isdir(SHM_DIR) or not os.access(SHM_DIR, os.W_OK):
        return f"{SHM_DIR} is not a writable directory"
    return None


class SharedMemoryGroup:
    """All-reduce (sum or mean) and all-gather of CPU tensors over a process group whose
    processes share a host.

    Collective: every process of `group` constructs it together, then calls the same
    collectives on tensors of the same size and dtype in the same order. Tensors larger
    than a slot (`slot_bytes`) go through in slot-sized pieces.
    """

    def __init__(self, group: dist.ProcessGroup | None, slot_bytes: int,
                 timeout_s: float) -> None:
        # The group is not kept: DDP holds this object as its hook's state, and a group
        # still referenced after destroy_process_group can abort gloo at exit.
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        agreed = torch.tensor([max(LINE, (slot_bytes + LINE - 1) // LINE * LINE)])
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=group)  # one layout for all
        self.slot_bytes = int(agreed.item())
        self.timeout_s = timeout_s
        self.round = 0
        self._fence = threading.Lock()
        # Poll only where every process can have a core of its own.
        self._spin_s = SPIN_S if self.world <= len(os.sched_getaffinity(0)) else 0.0
        header = LINE * self.world
        size = header + 2 * self.world * self.slot_bytes
        self._mm = _shared_segment(group, self.rank, size)
        self._raw = torch.frombuffer(self._mm, dtype=torch.uint8)
        self._header = header
        struct.pack_into("qq", self._mm, LINE * self.rank, 0, os.getpid())
        dist.barrier(group)  # every pid is written before anyone waits on a round
        self._pids = [struct.unpack_from("q", self._mm, LINE * r + 8)[0]
                      for r in range(self.world)]

    def close(self) -> None:
        """Unmap the segment (the tensors viewing it must be gone)."""
        self._raw = torch.empty(0, dtype=torch.uint8)
        self._mm.close()

    def _slot(self, parity: int, rank: int, dtype: torch.dtype, numel: int) -> torch.Tensor:
        start = self._header + (parity * self.world + rank) * self.slot_bytes
        return self._raw[start:start + numel * dtype.itemsize].view(dtype)

    def all_reduce(self, tensor: torch.Tensor, mean: bool = False) -> torch.Tensor:
        """Replace `tensor` (contiguous, on the CPU) by its sum over the group, or its mean;
        returns it. Every process gets the same bits."""
        if not tensor.is_contiguous() or tensor.device.type != "cpu":
            raise ValueError("SharedMemoryGroup: the tensor must be contiguous and on the CPU; "
                             f"got device {tensor.device}, contiguous {tensor.is_contiguous()}")
        flat = tensor.view(-1)
        per = max(1, self.slot_bytes // tensor.element_size())
        for start in range(0, flat.numel(), per):
            self._round(flat[start:start + per], mean)
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every process's `tensor` (the same shape and dtype on all; CPU), in rank order,
        as new tensors."""
        flat = tensor.reshape(-1)
        out = [torch.empty_like(flat) for _ in range(self.world)]
        per = max(1, self.slot_bytes // tensor.element_size())
        for start in range(0, flat.numel(), per):
            piece = flat[start:start + per]
            n = piece.numel()
            self.round += 1
            parity = self.round & 1
            self._slot(parity, self.rank, piece.dtype, n).copy_(piece)
            self._publish()
            self._wait(self.round)
            for r in range(self.world):
                out[r][start:start + n].copy_(self._slot(parity, r, piece.dtype, n))
        return [o.view_as(tensor) for o in out]

    def _round(self, piece: torch.Tensor, mean: bool) -> None:
        if self.world == 1:
            return  # its own sum, and mean
        self.round += 1
        parity, n, dtype = self.round & 1, piece.numel(), piece.dtype
        mine = self._slot(parity, self.rank, dtype, n)
        if mean:  # divided first, as DDP's own hook does: a half-precision sum cannot overflow
            torch.div(piece, self.world, out=mine)
        else:
            mine.copy_(piece)
        self._publish()
        self._wait(self.round)
        torch.add(self._slot(parity, 0, dtype, n), self._slot(parity, 1, dtype, n), out=piece)
        for r in range(2, self.world):
            piece.add_(self._slot(parity, r, dtype, n))

    def _publish(self) -> None:
        """Raise this process's counter to the current round, after its slot's data. A
        copy may use non-temporal stores (large memcpy), which total store order does not
        keep in order: taking and giving back a lock is a locked instruction, after which
        they are visible before the counter's store."""
        self._fence.acquire()
        self._fence.release()
        struct.pack_into("q", self._mm, LINE * self.rank, self.round)

    def _missing(self, round_: int) -> list[int]:
        return [r for r in range(self.world)
                if struct.unpack_from("q", self._mm, LINE * r)[0] < round_]

    def _wait(self, round_: int) -> None:
        """Until every process has written round `round_`: poll, then nap; raise when a
        missing peer has died or the collective timeout has passed."""
        start = time.perf_counter()
        next_check = start + PEER_CHECK_S
        unpack, mm = struct.unpack_from, self._mm
        for r in range(self.world):
            while unpack("q", mm, LINE * r)[0] < round_:
                now = time.perf_counter()
                if now - start > self._spin_s:
                    time.sleep(NAP_S)
                if now >= next_check:
                    next_check = now + PEER_CHECK_S
                    self._check_peers(round_, now - start)

    def _check_peers(self, round_: int, waited_s: float) -> None:
        missing = self._missing(round_)
        dead = [r for r in missing if not alive(self._pids[r])]
        if dead:
            raise dist.DistBackendError(
                f"gradient all-reduce (shared memory, round {round_}): rank(s) {dead} "
                f"(pid {[self._pids[r] for r in dead]}) exited while rank {self.rank} "
                "waited for them")
        if waited_s > self.timeout_s:
            raise dist.DistBackendError(
                f"gradient all-reduce (shared memory, round {round_}): rank(s) {missing} "
                f"did not arrive within plan.timeout_s = {self.timeout_s:g} s")


def _shared_segment(group: dist.ProcessGroup | None, rank: int, size: int) -> mmap.mmap:
    """Map one segment of `size` bytes in every process of `group`, or raise OSError in
    all of them (when any process cannot reach it: another host, another /dev/shm)."""
    word = secrets.token_bytes(8)
    box: list[object] = [(f"{SHM_DIR}/tandem-allreduce-{os.getpid()}-{secrets.token_hex(6)}",
                          word) if rank == 0 else None]
    mm: mmap.mmap | None = None
    problem = ""
    try:
        if rank == 0:
            path = str(box[0][0])  # type: ignore[index]
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                os.posix_fallocate(fd, 0, size)  # no space: an error now, not SIGBUS later
                mm = mmap.mmap(fd, size)
            finally:
                os.close(fd)
            mm[LINE * 0:LINE * 0 + 8] = word  # rank 0's counter line, cleared below
    except OSError as err:
        problem = f"rank 0 could not create the segment: {err}"
    dist.broadcast_object_list(box, src=0, group=group)
    path, word = box[0]  # type: ignore[misc]
    if rank != 0 and not problem:
        try:
            fd = os.open(path, os.O_RDWR)
            try:
                mm = mmap.mmap(fd, size)
            finally:
                os.close(fd)
            if mm[0:8] != word:
                problem = f"rank {rank} sees another segment under {path}"
        except (OSError, ValueError) as err:
            problem = f"rank {rank} could not map {path}: {err}"
    ok = torch.tensor([0 if problem or mm is None else 1], dtype=torch.int32)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)  # everyone has mapped (or not)
    if rank == 0:
        try:
            os.unlink(path)
        except OSError:
            pass
    if not ok.item():
        if mm is not None:
            mm.close()
        raise OSError(problem or "another process could not map the shared segment")
    assert mm is not None
    if rank == 0:
        mm[0:8] = bytes(8)
    return mm
