"""What the NCCL/cuBLASMp suites share: one rank per GPU, its communicator, stream and handle.

    with rank_per_gpu(report) as (world, comm, stream, handle):
        report.check(...)

Refuses (one FAIL line, exit status 1) when a node has more ranks than GPUs; at the end, on every
rank alike, synchronizes, closes the handle and the communicator, and waits for every rank.
Suites that set up their own device and libraries use the two ends alone (:func:`local_gpu`,
:func:`finish`): those need no torch, which ``raw_multirank.py`` must not import.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from mpi4py import MPI
from suite_report import Report, emit

from mpbind import cublasmp, nccl


def local_gpu(world: Any, report: Report, devices: int) -> int:
    """This rank's GPU: its rank among the ranks of its node, of `devices` GPUs there. Refuses (one
    FAIL line, the summary, exit status 1) when the node has more ranks than GPUs."""
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    if devices < node.Get_size():
        report.failed += 1
        report.line("FAIL", "setup", f"{node.Get_size()} ranks on this node but {devices} GPUs: NCCL needs one GPU "
                                     "per rank")
        emit(report.summary())
        sys.exit(1)
    return int(node.Get_rank())


def finish(world: Any, report: Report) -> int:
    """Wait for every rank, print this one's summary; the exit status (1 when anything failed)."""
    world.Barrier()
    emit(report.summary())
    return 1 if report.failed else 0


@contextlib.contextmanager
def rank_per_gpu(report: Report) -> Iterator[tuple[Any, nccl.Communicator, Any, cublasmp.Handle]]:
    import torch

    world = MPI.COMM_WORLD
    torch.cuda.set_device(local_gpu(world, report, torch.cuda.device_count()))
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
    finish(world, report)
