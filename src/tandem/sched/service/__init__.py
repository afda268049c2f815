"""The live scheduler: its store tables, job lifecycle, service loop, API and commands."""
