"""Scheduling policies and the job, cluster and throughput models they decide on."""
