"""GPU families: which recommendations apply to a GPU, from its NVML product name."""

from __future__ import annotations

import re

FAMILIES = ("H100/H200", "B200", "A100", "L40S", "RTX 4090/5090")
OTHER = "other"

_PATTERNS = (
    (r"\b(GH200|H100|H200|H800|H20)\b", "H100/H200"),
    (r"\b(GB200|GB300|B200|B300|B100)\b", "B200"),
    (r"\b(A100|A800)\b", "A100"),
    (r"\bL40S?\b", "L40S"),
    (r"\bRTX (4090|5090)\b", "RTX 4090/5090"),
)


def gpu_family(name: str | None) -> str:
    """The family of a GPU product name, or "other"."""
    if not name:
        return OTHER
    for pattern, family in _PATTERNS:
        if re.search(pattern, name, re.IGNORECASE):
            return family
    return OTHER
