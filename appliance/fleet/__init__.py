"""Fleets: many hosts driven over SSH (fabric) from one hosts file: provision, check, baseline,
run, collect, and one report across the hosts."""
