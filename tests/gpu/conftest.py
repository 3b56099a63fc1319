"""The GPU test wrappers share the helper modules beside them (suite_report, mpirun_suite).

The suites run as scripts under mpirun, with this folder on their path; the pytest wrappers
(imported with ``--import-mode=importlib``) get it here.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
