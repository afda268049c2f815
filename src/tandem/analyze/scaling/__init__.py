"""Throughput at other process counts: efficiency measured, the model that predicts it."""
