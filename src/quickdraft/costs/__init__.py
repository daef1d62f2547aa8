"""Costs: what a forward of k rows costs on this host (cost curves, timing, the host's CPU)."""
