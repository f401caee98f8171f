"""Tasks shared by tests and subprocess workers.

``autodiscover_modules("tasks")`` imports this module; it imports every
``tasks_*`` module beside it so each test area keeps its tasks in its own file.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

for _info in pkgutil.iter_modules([str(Path(__file__).parent)]):
    if _info.name.startswith("tasks_"):
        importlib.import_module(f"{__package__}.{_info.name}")
