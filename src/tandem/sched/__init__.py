"""Scheduling many training jobs on a shared cluster: job model, policies, simulator.

The pieces the live scheduler and the simulator share:

- `JobSpec` (what is submitted) and `JobView` (what a policy knows of a job now);
- `ThroughputModel` (step time at any size, fitted from measurements), `EfficiencyModel`
  (statistical efficiency from the gradient noise scale) and `GoodputModel` (their product,
  with the best batch at each size);
- policies with one call, `policy.allocate(jobs, cluster, now) -> {job_id: placement}`:
  `FIFOPolicy`, `TiresiasPolicy` (discretised 2D least-attained-service) and
  `GoodputPolicy` (elastic, goodput-maximising with fairness and resize costs);
- `simulate()`, which replays a workload against measured traces.
"""

from tandem.sched.cluster import Cluster
from tandem.sched.efficiency import EfficiencyModel
from tandem.sched.fifo import FIFOPolicy
from tandem.sched.goodput import BatchConfig, GoodputModel
from tandem.sched.goodput_policy import GoodputPolicy
from tandem.sched.job import BatchLimits, JobSpec, JobView, Placement
from tandem.sched.policy import Allocations, Policy
from tandem.sched.simulator import SimResult, simulate
from tandem.sched.throughput import StepSample, ThroughputModel
from tandem.sched.tiresias import TiresiasPolicy

POLICIES = {"fifo": FIFOPolicy, "tiresias": TiresiasPolicy, "goodput": GoodputPolicy}

__all__ = [
    "POLICIES", "Allocations", "BatchConfig", "BatchLimits", "Cluster", "EfficiencyModel",
    "FIFOPolicy", "GoodputModel", "GoodputPolicy", "JobSpec", "JobView", "Placement",
    "Policy", "SimResult", "StepSample", "ThroughputModel", "TiresiasPolicy", "simulate",
]
