"""Importing a Python file that is on no import path (a script, a candidate) as a module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def import_file(path: Path) -> ModuleType:
    """The file at `path`, executed as a module named after its stem and registered in
    sys.modules under that name (a dataclass looks its module up while being defined)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
