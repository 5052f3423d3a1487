"""Run reports: the versioned JSON Schema, validation that names failing paths, and Markdown."""

from appliance.report.render_md import InvalidReport, render_markdown
from appliance.report.schema import (
    SCHEMA_VERSION,
    ReportError,
    load_schema,
    validate_file,
    validate_report,
)

__all__ = [
    "SCHEMA_VERSION",
    "InvalidReport",
    "ReportError",
    "load_schema",
    "render_markdown",
    "validate_file",
    "validate_report",
]
