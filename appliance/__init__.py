"""autotune appliance: the CLI, the pipeline, configuration, reports and fleets (top layer)."""

__version__ = "0.1.0"
