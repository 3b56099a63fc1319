"""NVSHMEM's initialisation with PEs placed on GPUs as asked, under mpirun.

    mpirun -np N python tests/gpu/nvshmem_placement_suite.py --gpus 0,0,1 [--init mpi|uid|uid_via]

PE k runs on GPU ``gpus[k]``. When mpbind's placement check (mpbind._infra.placement.problem) refuses the
placement, every PE must raise the same PlacementError before NVSHMEM is entered; otherwise every
PE must initialise (and finalize). ``--expect refused|initialised`` says which the test wants; a PE
that neither raises nor returns within the suite's own deadline is reported by mpirun's timeout.
``uid_via`` bootstraps from a unique id and checks the placement over ``placement_via=comm``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

from mpi4py import MPI  # noqa: E402
from runner import Check, Checks, Report, expect, main  # noqa: E402

from mpbind import nvshmem as nv  # noqa: E402
from mpbind._infra import placement as _placement  # noqa: E402
from mpbind.bootstrap import share_unique_id  # noqa: E402
from mpbind.errors import PlacementError  # noqa: E402


def init(args: argparse.Namespace, comm: MPI.Comm, device: int) -> nv.Runtime:
    if args.init == "mpi":
        return nv.init(mpi_comm=comm, device=device)
    uid = share_unique_id("nvshmem", comm)
    via = comm if args.init == "uid_via" else None
    return nv.init(uid, comm.Get_rank(), comm.Get_size(), device=device, placement_via=via, notice_after=20)


@dataclass
class Ctx:
    args: argparse.Namespace
    comm: MPI.Comm
    report: Report
    device: int  # this PE's GPU


CHECKS = Checks()


@CHECKS.cases
def placement(c: Ctx) -> Iterator[Check]:
    yield f"init.{c.args.init}", lambda: check(c.args, c.comm, c.report, c.device)


def check(args: argparse.Namespace, comm: MPI.Comm, report: Report, device: int) -> str:
    gpus = comm.allgather(_placement.this_gpu(device))
    report.info("placement", f"device {device}; problem(): {_placement.problem(gpus)}")
    start = time.monotonic()
    try:
        rt = init(args, comm, device)
    except PlacementError as exc:
        messages = comm.allgather(str(exc))
        expect(args.expect == "refused", f"refused, but the test expected an initialisation: {exc}")
        expect(len(set(messages)) == 1, f"the PEs raised different messages: {messages}")
        return f"PlacementError after {time.monotonic() - start:.2f} s: {exc}"
    expect(args.expect == "initialised", "initialised, but the test expected a PlacementError")
    note = f"initialised in {time.monotonic() - start:.2f} s: pe {rt.my_pe} of {rt.n_pes}, limited_mpg={rt.limited_mpg}"
    rt.finalize()
    return note


@contextlib.contextmanager
def started(args: argparse.Namespace, report: Report) -> Iterator[Ctx]:
    comm = MPI.COMM_WORLD
    gpus = [int(g) for g in args.gpus.split(",")]
    if len(gpus) != comm.Get_size():
        raise SystemExit(f"--gpus names {len(gpus)} GPUs for {comm.Get_size()} processes")
    yield Ctx(args, comm, report, gpus[comm.Get_rank()])


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--gpus", required=True, help="GPU of each PE, e.g. 0,0,1")
    ap.add_argument("--init", choices=("mpi", "uid", "uid_via"), default="mpi")
    ap.add_argument("--expect", choices=("refused", "initialised"), required=True)


if __name__ == "__main__":
    sys.exit(main(__doc__, started, CHECKS, arguments=arguments, timeout=100.0))
