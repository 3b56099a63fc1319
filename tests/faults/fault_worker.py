"""One process of a fault-injection case: tests/faults/test_faults_gpu.py starts one per rank (plain
processes, not mpirun: Open MPI ends the whole job when one rank is killed, and the survivors are
what the cases watch), or under mpirun for the cases that need MPI and kill nothing.

    python fault_worker.py CASE --rank R --size N --dir D --deadline T [--kill-at K] [--config blocking]

The ranks meet through files in D (rank 0 writes the unique id). Each rank writes lines the test
reads: ``STEP name time.time()`` as it goes, and last ``OUTCOME {json}``: what the rank saw (the
error's class and message, when it was raised, what still held), or nothing when it was killed or
ended by the watchdog (NVSHMEM: exit status 70, its report on stderr).

Cases (see test_faults_gpu.py for what each must show):

    init            rank 0 of 2 initialises NCCL; rank 1 never comes (or raises before init)
    raise_before    rank 1 raises before init; rank 0 initialises and waits for it
    kill_allreduce  a loop of watched all-reduces; rank --kill-rank is SIGKILLed at iteration K
    kill_matmul     a loop of planned cuBLASMp matmuls; the same
    skip            rank 1 skips the last all-reduce of the loop (alive, elsewhere)
    kill_fft        a loop of cuFFTMp FFTs over NVSHMEM; PE --kill-rank is SIGKILLed at iteration K
    kill_barrier    a loop of NVSHMEM barriers on a stream; the same
    nvshmem_init    NVSHMEM's initialisation with PE --kill-rank never there (uid) or never calling
                    init (--mpi: the arrival check over MPI names it)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

RENDEZVOUS = 120.0  # seconds a rank waits for rank 0's unique id file


def step(name: str) -> None:
    sys.stdout.write(f"STEP {name} {time.time():.6f}\n")
    sys.stdout.flush()


def outcome(**fields: Any) -> None:
    sys.stdout.write("OUTCOME " + json.dumps(fields, default=str) + "\n")
    sys.stdout.flush()


def error_fields(exc: BaseException) -> dict[str, Any]:
    return {"error": type(exc).__name__, "mro": [c.__name__ for c in type(exc).__mro__], "message": str(exc),
            "raised_at": time.time()}


def die(args: argparse.Namespace, where: str) -> None:
    """SIGKILL this process (the fault), saying where first."""
    step("killed." + where.replace(" ", "."))  # a step name is one word: "STEP <name> <time>"
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def unique_id(args: argparse.Namespace, library: str) -> Any:
    """`library`'s unique id, made by rank 0 and read by the others from a file of the case's folder."""
    from mpbind.bootstrap import share_unique_id

    path = Path(args.dir) / f"{library}.uid"

    def broadcast(data: bytes | None, root: int) -> bytes:
        if data is not None:
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            tmp.rename(path)
            return data
        end = time.monotonic() + RENDEZVOUS
        while not path.exists():
            if time.monotonic() > end:
                raise TimeoutError(f"rank {root} never wrote {path}")
            time.sleep(0.05)
        return path.read_bytes()

    return share_unique_id(library, broadcast, rank=args.rank)


# --- NCCL ----------------------------------------------------------------------------------------


def nccl_config(args: argparse.Namespace) -> Any:
    from mpbind import nccl

    return None if args.config == "default" else nccl.Config(blocking=1 if args.config == "blocking" else 0)


def case_init(args: argparse.Namespace) -> None:
    """Rank 0 of a 2-rank communicator alone: its init gives up at the deadline, or on SIGINT."""
    import torch

    from mpbind import nccl

    torch.cuda.set_device(0)
    uid = unique_id(args, "nccl")
    if args.rank != 0:
        raise RuntimeError("this rank fails before it initialises NCCL (the fault)")
    step("ready")  # the test sends SIGINT after this when it checks Ctrl-C
    start = time.time()
    try:
        nccl.Communicator.init(args.size, 0, uid, nccl_config(args), timeout=args.deadline)
    except BaseException as exc:  # WaitTimeoutError, or KeyboardInterrupt
        outcome(started=start, **error_fields(exc))
        return
    outcome(started=start, error=None)


def torch_stream() -> Any:
    import torch

    return torch.cuda.Stream()


def watched_comm(args: argparse.Namespace) -> Any:
    import torch

    from mpbind import nccl

    torch.cuda.set_device(args.rank % torch.cuda.device_count())
    uid = unique_id(args, "nccl")
    comm = nccl.Communicator.init(args.size, args.rank, uid, nccl_config(args), timeout=args.deadline,
                                  watchdog=True)
    step("initialised")
    return comm


def after_failure(args: argparse.Namespace, comm: Any, doomed_at: float, last_good: int, kept: Any,
                  expected: float, exc: BaseException) -> None:
    """The survivor's report: the error, the result kept from before the fault, and a shrunk
    communicator of the survivors running a correct all-reduce."""
    import torch

    fields: dict[str, Any] = {"doomed_at": doomed_at, "last_good": last_good, **error_fields(exc)}
    fields["intact"] = bool(kept is not None and torch.all(kept == expected).item())
    fields["recent"] = comm.recent_operations()[-3:]
    survivors_gone = [args.kill_rank]
    try:
        with comm.shrink(survivors_gone) as small:
            x = torch.ones(1024, device="cuda")
            s = torch.cuda.Stream()
            small.all_reduce(x, x, stream=s)
            s.synchronize()
            fields["shrunk"] = {"size": small.size, "rank": small.rank,
                                "correct": bool(torch.all(x == small.size).item())}
    except BaseException as e:
        fields["shrunk"] = {"failed": f"{type(e).__name__}: {e}"}
    comm.close()
    outcome(**fields)


def expected_sum(args: argparse.Namespace, i: int) -> float:
    """The all-reduce (sum) of iteration i, where rank r contributes i + r."""
    return float(sum(i + r for r in range(args.size)))


def case_kill_allreduce(args: argparse.Namespace) -> None:
    import torch

    from mpbind.errors import MpbindError

    comm = watched_comm(args)
    s = torch_stream()
    x = torch.empty(1 << 16, device="cuda")
    kept, last_good, doomed_at = None, -1, 0.0
    try:
        for i in range(args.iterations):
            if i == args.kill_at and args.rank == args.kill_rank:
                die(args, f"iteration {i}")
            doomed_at = time.time()
            x.fill_(i + args.rank)
            comm.all_reduce(x, x, stream=s)  # raises once the communicator failed
            s.synchronize()  # released by the watchdog when the peer is gone
            if comm.failed:
                break  # this iteration did not complete
            assert torch.all(x == expected_sum(args, i)).item(), f"iteration {i}: wrong all-reduce result"
            kept, last_good = x.clone(), i
        comm.all_reduce(x, x, stream=s)  # refused: the communicator failed
    except MpbindError as exc:
        after_failure(args, comm, doomed_at, last_good, kept, expected_sum(args, last_good), exc)
        return
    outcome(error=None, last_good=last_good)


def case_skip(args: argparse.Namespace) -> None:
    import torch

    from mpbind.errors import MpbindError

    comm = watched_comm(args)
    s = torch_stream()
    x = torch.empty(1 << 12, device="cuda")
    kept, last_good, doomed_at = None, -1, 0.0
    last = args.iterations - 1
    try:
        for i in range(args.iterations):
            if i == last and args.rank == args.kill_rank:
                step("skipped")  # this rank goes on elsewhere: it never joins the last all-reduce
                time.sleep(args.deadline + 15)
                comm.abort()
                outcome(error=None, skipped=True)
                return
            doomed_at = time.time()
            x.fill_(i + args.rank)
            comm.all_reduce(x, x, stream=s)
            s.synchronize()
            if i < last:
                assert torch.all(x == expected_sum(args, i)).item(), f"iteration {i}: wrong result"
                kept, last_good = x.clone(), i
        comm.all_reduce(x, x, stream=s)
    except MpbindError as exc:
        after_failure(args, comm, doomed_at, last_good, kept, expected_sum(args, last_good), exc)
        return
    outcome(error=None, last_good=last_good)


def case_kill_matmul(args: argparse.Namespace) -> None:
    import torch

    from mpbind import cublasmp, matmul
    from mpbind import distributions as dist
    from mpbind.errors import MpbindError

    comm = watched_comm(args)
    p, r = args.size, args.rank
    m, n, k = 64 * p, 32 * p, 48 * p
    da, db, dd = dist.Split((m, k), p, 0), dist.Split((k, n), p, 1), dist.Split((m, n), p, 0)  # AllGather+GEMM

    def piece(d: Any, value: float) -> Any:
        rows, cols = d.local_shape(r)
        return torch.full((cols, rows), value, device="cuda").t()

    a, b, d = piece(da, 1.0), piece(db, 2.0), piece(dd, float("nan"))
    handle = cublasmp.Handle()
    plan = matmul.plan(comm, a, b, d, a_dist=da, b_dist=db, d_dist=dd, handle=handle)
    step("planned")
    expected = 2.0 * k
    kept, last_good, doomed_at = None, -1, 0.0
    try:
        for i in range(args.iterations):
            if i == args.kill_at and r == args.kill_rank:
                die(args, f"iteration {i}")
            doomed_at = time.time()
            d.fill_(float("nan"))
            plan.execute()
            torch.cuda.synchronize()
            if comm.failed:
                break
            assert torch.all(d == expected).item(), f"iteration {i}: wrong matmul result"
            kept, last_good = d.clone(), i
        plan.execute()  # refused once the communicator failed
    except MpbindError as exc:
        plan.close()
        handle.close()
        after_failure(args, comm, doomed_at, last_good, kept, expected, exc)
        return
    outcome(error=None, last_good=last_good)


# --- NVSHMEM ---------------------------------------------------------------------------------------


def nvshmem_started(args: argparse.Namespace, watchdog: bool = True) -> Any:
    import torch

    from mpbind import nvshmem

    device = 0 if args.one_gpu else args.rank % torch.cuda.device_count()
    torch.cuda.set_device(device)
    uid = unique_id(args, "nvshmem")
    rt = nvshmem.init(uid, args.rank, args.size, device=device, timeout=args.deadline, watchdog=watchdog)
    step("initialised")
    return rt


def case_kill_barrier(args: argparse.Namespace) -> None:
    import torch

    from mpbind import nvshmem

    nvshmem_started(args)
    s = torch.cuda.Stream()
    for i in range(args.iterations):
        if i == args.kill_at and args.rank == args.kill_rank:
            die(args, f"iteration {i}")
        nvshmem.barrier_all(stream=s)
        s.synchronize()  # the survivors never pass the barrier after the kill: the watchdog ends them
        step(f"barrier.{i}")
    outcome(error=None)


def case_kill_fft(args: argparse.Namespace) -> None:
    import torch

    from mpbind import fft

    nvshmem_started(args)
    shape = (32, 32, 32)
    plan = fft.plan(None, shape, "complex64")
    gen = torch.Generator(device="cpu").manual_seed(28 + args.rank)
    for i in range(args.iterations):
        if i == args.kill_at and args.rank == args.kill_rank:
            die(args, f"iteration {i}")
        inp = torch.from_dlpack(plan.input_view())
        values = torch.complex(torch.rand(inp.shape, generator=gen), torch.rand(inp.shape, generator=gen)).cuda()
        inp.copy_(values)
        plan.execute()
        back = torch.from_dlpack(plan.execute(direction="inverse"))
        torch.cuda.synchronize()
        n = shape[0] * shape[1] * shape[2]
        err = float((back / n - values).abs().max())
        assert err < 1e-4, f"iteration {i}: round trip error {err}"
        step(f"fft.{i}")
    outcome(error=None)


def case_nvshmem_init(args: argparse.Namespace) -> None:
    import torch

    from mpbind import nvshmem

    torch.cuda.set_device(0)
    if args.mpi:
        from mpi4py import MPI

        if args.rank == args.kill_rank:  # alive, but never calls init
            step("absent")
            time.sleep(args.deadline + 20)
            outcome(error=None, absent=True)
            return
        start = time.time()
        try:
            nvshmem.init(mpi_comm=MPI.COMM_WORLD, device=0, timeout=args.deadline)
        except BaseException as exc:
            outcome(started=start, **error_fields(exc))
            return
        outcome(started=start, error=None)
        return
    uid = unique_id(args, "nvshmem")
    start = time.time()
    try:
        nvshmem.init(uid, args.rank, args.size, device=0, timeout=args.deadline)
    except BaseException as exc:
        outcome(started=start, **error_fields(exc))
        return
    outcome(started=start, error=None)


CASES = {
    "init": case_init,
    "raise_before": case_init,
    "kill_allreduce": case_kill_allreduce,
    "kill_matmul": case_kill_matmul,
    "skip": case_skip,
    "kill_barrier": case_kill_barrier,
    "kill_fft": case_kill_fft,
    "nvshmem_init": case_nvshmem_init,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("--rank", type=int, default=int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    ap.add_argument("--size", type=int, default=int(os.environ.get("OMPI_COMM_WORLD_SIZE", "2")))
    ap.add_argument("--dir", default=".")
    ap.add_argument("--deadline", type=float, default=10.0, help="timeout= of the communicator or runtime")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--kill-at", type=int, default=5)
    ap.add_argument("--kill-rank", type=int, default=1)
    ap.add_argument("--config", choices=["default", "blocking", "nonblocking"], default="default")
    ap.add_argument("--one-gpu", action="store_true", help="every PE on GPU 0 (NVSHMEM under MPS)")
    ap.add_argument("--mpi", action="store_true", help="nvshmem_init over MPI (under mpirun)")
    ap.add_argument("--token", default="", help="marks this case's processes (the test looks for leftovers)")
    args = ap.parse_args()
    sys.stdout.write(f"PID {os.getpid()}\n")  # the test signals this process, not the timeout(1) around it
    step("started")
    CASES[args.case](args)
    step("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
