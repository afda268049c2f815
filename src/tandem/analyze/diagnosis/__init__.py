"""A run's figures turned into findings: named bottlenecks with evidence and predicted gains."""
