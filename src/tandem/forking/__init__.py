"""Workers that start warm: a fork server that imports torch once and forks each worker."""
