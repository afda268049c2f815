"""The cluster simulator: workloads replayed against measured traces under a policy."""
