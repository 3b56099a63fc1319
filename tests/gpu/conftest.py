"""What every GPU test here needs before it runs.

* NVLink multicast off, before NCCL, NVSHMEM or torch initialise anything in this process (the
  suites started under mpirun set it themselves and get it through ``-x``).
* JAX without its default preallocation (75 % of the GPU's memory, held for the rest of the session):
  the suites it runs beside, under mpirun and MPS, need that memory for NVSHMEM's heaps.
* With ``MPBIND_NVSHMEM_PATH`` set, that NVSHMEM loaded before any test imports PyTorch.
* The modules beside this file (the runner, the suites' helpers) importable: the suites run as
  scripts with this folder on their path; the pytest modules (imported with
  ``--import-mode=importlib``) get it here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("XLA_PYTHON_CLIENT_PREALLOCATE", "false")):
    os.environ.setdefault(_name, _value)

# With MPBIND_NVSHMEM_PATH naming a copy of NVSHMEM, load it before any test imports PyTorch (which
# maps its own): the process then holds one copy, as mpbind.load_libraries() documents.
if os.environ.get("MPBIND_NVSHMEM_PATH"):
    import mpbind

    mpbind.load_libraries("nvshmem")

_HERE = str(Path(__file__).parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture(scope="module")
def nccl_one_rank() -> Iterator[Any]:
    """A one-rank mpbind.nccl.Communicator on GPU 0 (torch's current device set to it), closed after the module."""
    import torch

    from mpbind import nccl

    torch.cuda.set_device(0)
    c = nccl.Communicator.init(1, 0, nccl.get_unique_id())
    yield c
    torch.cuda.synchronize()
    c.close()
