"""Throughput at other process counts: scaling efficiency measured, and the model that predicts it."""
