"""What the NCCL/cuBLASMp layer suites share: one rank per GPU, its communicator, stream and handle.

    with rank_per_gpu(report) as (world, comm, stream, handle):
        report.check(...)

Refuses (one FAIL line, exit status 1) when a node has more ranks than GPUs; at the end, on every
rank alike, synchronizes, closes the handle and the communicator, and waits for every rank.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch
from mpi4py import MPI
from suite_report import Report

from mpbind import cublasmp, nccl


@contextlib.contextmanager
def rank_per_gpu(report: Report) -> Iterator[tuple[Any, nccl.Communicator, Any, cublasmp.Handle]]:
    world = MPI.COMM_WORLD
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    if torch.cuda.device_count() < node.Get_size():
        report.failed += 1
        report.line("FAIL", "setup", f"{node.Get_size()} ranks on this node but {torch.cuda.device_count()} GPUs")
        print(report.summary(), flush=True)
        sys.exit(1)
    torch.cuda.set_device(node.Get_rank())
    comm = nccl.Communicator.from_mpi(world)
    stream = torch.cuda.Stream()
    torch.cuda.set_stream(stream)
    handle = cublasmp.Handle(stream)
    try:
        yield world, comm, stream, handle
    finally:
        torch.cuda.synchronize()
        handle.close()
        comm.close()
    world.Barrier()
    print(report.summary(), flush=True)
