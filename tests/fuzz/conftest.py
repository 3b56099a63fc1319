"""The fuzz harness's modules (fuzz_targets, fuzz_calls, fuzz_runner) are plain files beside its
script, sweep.py; tests import them from this folder."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
