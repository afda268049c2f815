"""Where attempts run: this machine's processes, a Ray cluster, or Slurm."""
