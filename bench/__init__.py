"""Side-by-side benchmarks of timerl against eager baselines written in this repository."""
