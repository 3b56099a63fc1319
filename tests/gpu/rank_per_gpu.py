"""What the NCCL/cuBLASMp suites share: one rank per GPU, its communicator, stream and handle.

    @contextlib.contextmanager
    def started(args, report):
        with rank_per_gpu() as (world, comm, stream, handle):
            yield Ctx(...)

Refuses (a failed set-up, on every rank alike) when a node has more ranks than GPUs; at the end,
on every rank alike, synchronizes, closes the handle and the communicator, and waits for every
rank. Suites that set up their own device and libraries use :func:`local_gpu` alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from mpi4py import MPI

from mpbind import cublasmp, nccl


def local_gpu(world: Any, devices: int) -> int:
    """This rank's GPU: its rank among the ranks of its node, of `devices` GPUs there. Refuses when
    the node has more ranks than GPUs."""
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    if devices < node.Get_size():
        raise RuntimeError(f"{node.Get_size()} ranks on this node but {devices} GPUs: NCCL needs one GPU per rank")
    return int(node.Get_rank())


@contextlib.contextmanager
def rank_per_gpu() -> Iterator[tuple[Any, nccl.Communicator, Any, cublasmp.Handle]]:
    import torch

    world = MPI.COMM_WORLD
    torch.cuda.set_device(local_gpu(world, torch.cuda.device_count()))
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
