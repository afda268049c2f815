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

from tandem.sched.policies.cluster import Cluster
from tandem.sched.policies.efficiency import EfficiencyModel
from tandem.sched.policies.fifo import FIFOPolicy
from tandem.sched.policies.goodput import BatchConfig, GoodputModel
from tandem.sched.policies.goodput_policy import GoodputPolicy
from tandem.sched.policies.job import BatchLimits, JobSpec, JobView, Placement
from tandem.sched.policies.policy import Allocations, Policy
from tandem.sched.policies.throughput import StepSample, ThroughputModel
from tandem.sched.policies.tiresias import TiresiasPolicy
from tandem.sched.simulation.simulator import SimResult, simulate

POLICIES = {"fifo": FIFOPolicy, "tiresias": TiresiasPolicy, "goodput": GoodputPolicy}

__all__ = [
    "POLICIES", "Allocations", "BatchConfig", "BatchLimits", "Cluster", "EfficiencyModel",
    "FIFOPolicy", "GoodputModel", "GoodputPolicy", "JobSpec", "JobView", "Placement",
    "Policy", "SimResult", "StepSample", "ThroughputModel", "TiresiasPolicy", "simulate",
]
