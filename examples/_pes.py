"""What the multi-PE examples share: NVLink multicast off (before CUDA, NCCL or NVSHMEM start) and
this process's GPU: GPU 0 for every PE with --one-gpu (several PEs share it), else one GPU per PE."""

from __future__ import annotations

import os
from typing import Any


def start(one_gpu: bool) -> tuple[Any, int]:
    """(MPI.COMM_WORLD, the CUDA device made current)."""
    for name, value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                        ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
        os.environ.setdefault(name, value)
    import torch
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    device = 0 if one_gpu else comm.Get_rank() % torch.cuda.device_count()
    torch.cuda.set_device(device)
    return comm, device
