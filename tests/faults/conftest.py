"""What the fault-injection cases need before they run: NVLink multicast off (as in every GPU
suite), and the GPU suites' runner (tests/gpu/runner.py: GPU counts, MPS, mpirun) importable."""

from __future__ import annotations

import os
import sys
from pathlib import Path

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

_GPU = str(Path(__file__).parents[1] / "gpu")
if _GPU not in sys.path:
    sys.path.insert(0, _GPU)
