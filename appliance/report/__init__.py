"""Run reports: the versioned JSON Schema, validation that names failing paths, upgrades of older
versions, Markdown and HTML renderings, `verify` (re-measure the claims) and `compare`."""

from appliance.report.compare import compare_reports
from appliance.report.document import InvalidReport, checked, load_report, upgrade
from appliance.report.render_html import render_html
from appliance.report.render_md import render_markdown
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
    "checked",
    "compare_reports",
    "load_report",
    "load_schema",
    "render_html",
    "render_markdown",
    "upgrade",
    "validate_file",
    "validate_report",
]
