"""The Ray backend: each attempt is gang-scheduled by a placement group on a Ray cluster.

The service joins an existing cluster (`--ray-address`, or RAY_ADDRESS) as a driver. An
attempt on N processes reserves one bundle of N slots (CPUs, or GPUs with a CPU each)
with STRICT_PACK, so all of it lands on one node at once or not at all; a detached actor
in that bundle starts `tandem.sched.service.attempt` (and so `tandem run --nproc-per-node N`),
with the GPUs Ray gave it. Placement group and actor are named after the attempt, so a
restarted service finds them again by name. The attempt directory is on a file system
both sides see (as the run's checkpoints must be, for a resume on another node).

A killed actor orphans the attempt, which then stops itself gracefully (it watches the
actor's pid): a committed checkpoint, and the scheduler resumes the job from it. A killed
training process fails the attempt; the job resumes from its last checkpoint. A job runs
within one node (the cluster's slots per node bound its size).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tandem.sched.backends.backend import LaunchPlan, kill_marked, shim_command
from tandem.sched.policies.cluster import Cluster

log = logging.getLogger("tandem")
NAMESPACE = "tandem"
CALL_TIMEOUT_S = 30.0


def _runner_class() -> type:
    """The actor class, defined here so that Ray ships it by value: a Ray worker then
    imports nothing of tandem (no torch import delays the start)."""

    class AttemptRunner:
        """Starts one attempt's shim from its actor's process and signals it.

        Ray kills an actor's child processes with the actor, so the shim is started one
        generation further down (a fork that exits at once) and watches the actor's pid
        instead (TANDEM_SCHED_GUARDIAN): when the actor dies, the shim stops the job
        gracefully rather than dying with it and leaving the job running unwatched.
        """

        def __init__(self, command: list[str], env: dict[str, str], cwd: str,
                     attempt_dir: str) -> None:
            import os
            import subprocess
            import sys

            self.attempt_dir = attempt_dir
            detach = ("import os, sys\nif os.fork():\n    os._exit(0)\nos.setsid()\n"
                      "os.execv(sys.argv[1], sys.argv[1:])")
            with open(os.path.join(attempt_dir, "log.txt"), "ab") as out:
                subprocess.run([sys.executable, "-c", detach, *command],
                               env={**os.environ, **env, "TANDEM_SCHED_GUARDIAN":
                                    str(os.getpid())},
                               cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, check=True)

        def signal(self, signum: int) -> bool:
            import json
            import os

            try:
                with open(os.path.join(self.attempt_dir, "shim.json")) as f:
                    os.kill(int(json.load(f)["pid"]), signum)
            except (OSError, ValueError, KeyError):
                return False
            return True

        def kill_all(self, marker: str) -> int:
            import psutil

            found = []
            for proc in psutil.process_iter(["pid"]):
                try:
                    if proc.environ().get("TANDEM_SCHED_ATTEMPT") == marker:
                        found.append(proc)
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
            for proc in found:
                try:
                    proc.kill()
                except psutil.NoSuchProcess:
                    continue
            psutil.wait_procs(found, timeout=10)
            return len(found)

    return AttemptRunner


def names(marker: str) -> str:
    """The placement group's and the actor's name for an attempt."""
    return "tandem-" + hashlib.sha1(marker.encode()).hexdigest()[:20]


class RayBackend:
    """Attempts as placement-grouped actors on a running Ray cluster."""

    name = "ray"

    def __init__(self, address: str | None) -> None:
        if not address:
            raise ValueError("--ray-address: none given and RAY_ADDRESS is unset; the ray "
                             "backend joins a running cluster (`ray start --head ...`)")
        try:
            import ray
        except ImportError:
            raise ValueError("--backend ray needs Ray: pip install 'ray>=2.9'") from None
        self.ray = ray
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False,
                 ignore_reinit_error=True, configure_logging=False)
        self.runner = ray.remote(_runner_class())
        self.kind = "CPU"
        self.cluster()

    def cluster(self) -> Cluster:
        """Nodes that have the slot resource (GPU if any node has one, else CPU)."""
        nodes = [n for n in self.ray.nodes() if n.get("Alive")]
        kind = "GPU" if any(n["Resources"].get("GPU", 0) >= 1 for n in nodes) else "CPU"
        slots = [int(n["Resources"].get(kind, 0)) for n in nodes]
        slots = [s for s in slots if s >= 1]
        if not slots:
            raise ValueError("the Ray cluster has no node with a CPU or GPU to give")
        self.kind = kind
        return Cluster(nodes=len(slots), slots_per_node=min(slots))

    def _bundle(self, procs: int) -> dict[str, float]:
        return {"GPU": procs, "CPU": procs} if self.kind == "GPU" else {"CPU": procs}

    def launch(self, plan: LaunchPlan, spec: dict[str, Any]) -> dict[str, Any]:
        """Create the attempt's placement group and its actor (which starts the shim once
        the group is placed); returns the names they go by."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        name = names(plan.marker)
        bundle = self._bundle(plan.procs)
        group = placement_group([bundle], strategy="STRICT_PACK", name=name,
                                lifetime="detached")
        self.runner.options(
            name=name, namespace=NAMESPACE, lifetime="detached", max_restarts=0,
            num_cpus=bundle.get("CPU", 0), num_gpus=bundle.get("GPU", 0),
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=0),
        ).remote([*shim_command(), str(plan.attempt_dir)], dict(spec["env"]), plan.job.cwd,
                 str(plan.attempt_dir))
        return {"actor": name, "marker": plan.marker, "bundle": bundle}

    def find(self, marker: str, attempt_dir: Path) -> dict[str, Any] | None:
        """The handle of an attempt whose launch the service did not record."""
        name = names(marker)
        try:
            self.ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            return None
        return {"actor": name, "marker": marker}

    def _actor(self, handle: Mapping[str, Any]) -> Any:
        try:
            return self.ray.get_actor(str(handle["actor"]), namespace=NAMESPACE)
        except ValueError:
            return None

    def alive(self, handle: Mapping[str, Any]) -> bool:
        """Whether the attempt's actor still exists (pending placement counts as alive)."""
        return self._actor(handle) is not None

    def stop(self, handle: Mapping[str, Any]) -> None:
        """SIGTERM to the shim through its actor (the launcher commits and exits 75)."""
        actor = self._actor(handle)
        if actor is not None:
            actor.signal.remote(15)

    def kill(self, handle: Mapping[str, Any]) -> None:
        """Kill every process of the attempt (through its actor, or on this host)."""
        actor = self._actor(handle)
        marker = str(handle.get("marker", ""))
        if actor is not None:
            try:
                self.ray.get(actor.kill_all.remote(marker), timeout=CALL_TIMEOUT_S)
            except Exception as err:  # the actor may be dying; fall back to this host
                log.warning("ray: could not kill through the actor: %s", err)
        if marker:
            kill_marked(marker)
        self.release(handle)

    def release(self, handle: Mapping[str, Any]) -> None:
        """Remove the attempt's actor and placement group (their slots go back)."""
        from ray.util import get_placement_group, remove_placement_group

        actor = self._actor(handle)
        if actor is not None:
            self.ray.kill(actor, no_restart=True)
        try:
            remove_placement_group(get_placement_group(str(handle["actor"])))
        except ValueError:
            pass  # already gone

    def close(self) -> None:
        """Leave the cluster (detached actors keep running)."""
        self.ray.shutdown()
