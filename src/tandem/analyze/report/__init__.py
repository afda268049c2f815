"""Rendering runs: the self-contained HTML report, the terminal summary, runs side by side."""
