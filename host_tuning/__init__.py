"""Host facts (NVML, sysfs, procfs, DMI), checks, profiles and journaled apply/restore (bottom layer)."""
