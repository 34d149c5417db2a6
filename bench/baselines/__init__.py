"""Eager and jitted reference implementations of the DRL algorithms timerl is measured against."""
