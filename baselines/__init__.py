"""Measurement: the one kernel timer, noise control, statistics, telemetry and host microbenchmarks."""
