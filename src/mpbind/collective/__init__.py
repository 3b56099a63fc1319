"""A collective matmul over NVSHMEM: ``out = all_gather(x, rows) @ w``, the gather overlapped with the
GEMMs, as in the bidirectional-ring all-gather matmul of JAX's Pallas guides.

Every PE holds ``x`` (``[m, k]``, its rows of the gathered left operand) and ``w`` (``[k, n]``, its
columns of the right operand) and gets ``out = concat(x of PE 0 .. P-1) @ w`` (``[P*m, n]``), any m.
Each chunk is split in two halves (its top m // 2 rows and the rest) that travel the ring in opposite
directions (the top half to the left neighbour, the bottom half to the right one), forwarded PE to PE
by NVSHMEM puts with signals; while the halves of step s+1 are in flight, the GEMMs of step s run.
The GEMM is the caller's: any callable ``gemm(a, b, out)`` that writes ``a @ b`` into ``out`` (arrays
of ``x``'s framework: PyTorch, CuPy); the default is ``torch.matmul(a, b, out=out)`` or
``out[...] = a @ b``.

::

    with nvshmem.init(mpi_comm=MPI.COMM_WORLD, device=rank) as rt:
        with AllGatherMatmul(m, k, n, "bfloat16") as agmm:    # collective: allocates the ring buffers
            out = agmm(x, w)                                  # on torch.cuda.current_stream()

Two ways to move the halves (``method=``):

* ``"host"``: on-stream NVSHMEM calls issued from the host on a second, high-priority stream
  (``nvshmemx_putmem_signal_nbi_on_stream``, ``nvshmemx_signal_wait_until_on_stream``), the GEMMs on
  the caller's stream, each after an on-stream wait for its half's signal;
* ``"kernel"``: one kernel per call, collectively launched on that second stream, issues every put
  and forwarding wait itself (``nvshmemx_putmem_signal_nbi_block`` by several CTAs); the GEMMs wait
  for its signals as above. One launch instead of 4(P-1) host calls.

PEs may share a GPU in NVSHMEM's full multi-PE-per-GPU mode (CUDA MPS with an active-thread limit).
There the GEMM library runs on a share of the SMs, and cuBLAS has been seen to get some small GEMMs
wrong on its own (PyTorch 2.11 with CUDA 13.0, 42 of an H200's 132 SMs: fp16 and bf16 128 x 512 x 384,
the half-chunk GEMM of m = 256, k = 512, n = 384): pass a ``gemm`` you trust there.

Checks: the plan's arguments (shapes, dtype, method, GPU) are compared across the PEs when it is made,
through a fixed-size exchange that cannot itself hang (:func:`mpbind.process_group.agree`), and every
PE raises the same ``UsageError`` when any PE's are wrong or differ; a call then checks its arrays
against the plan (shape, dtype, device, contiguity) before any NVSHMEM call. Plans are collective
objects: make, call and close them on every PE in the same order.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from typing import Any

from mpbind import _core, nvshmem
from mpbind._infra import args as _args
from mpbind._infra.interop import device_array, dlpack_code, dtype_name, itemsize, stream_handle
from mpbind._infra.owned import Uncopyable
from mpbind.errors import UsageError
from mpbind.process_group import NVSHMEMProcessGroup, ProcessGroup, agree, smallest

__all__ = ["AllGatherMatmul", "KERNEL_SOURCE"]

#: The "kernel" method's communication kernel. The symmetric buffers hold, per call parity, P chunks
#: of m rows each, a top half of m // 2 rows and a bottom half of the rest (slot(parity, source PE,
#: half)); signals are laid out per half and count the CTAs' puts (each adds 1), so the r-th call of a
#: parity has delivered a half once its signal reaches r * CTAs (`epoch` is r).
KERNEL_SOURCE = r"""
#include <nvshmem.h>
#include <nvshmemx.h>

// This CTA's slice of a half, with a signal that adds 1 (a CTA with no bytes left still signals).
__device__ void put_slice(char* dst, const char* src, unsigned long long len, uint64_t* signal, int pe) {
    if (len > 0) {
        nvshmemx_putmem_signal_nbi_block(dst, src, len, signal, 1, NVSHMEM_SIGNAL_ADD, pe);
    } else if (threadIdx.x == 0) {
        nvshmemx_signal_op(signal, 1, NVSHMEM_SIGNAL_ADD, pe);
    }
}

// This CTA's slice [*begin, *begin + *len) of a half of `bytes`.
__device__ void slice_of(unsigned long long bytes, unsigned long long* begin, unsigned long long* len) {
    const unsigned long long per = (bytes + gridDim.x - 1) / gridDim.x;
    *begin = min(bytes, blockIdx.x * per);
    *len = min(bytes, *begin + per) - *begin;
}

extern "C" __global__ void ag_ring(char* slots, const char* x, unsigned long long top_bytes,
                                   unsigned long long bottom_bytes, uint64_t* signals, unsigned long long epoch,
                                   int parity) {
    const int me = nvshmem_my_pe(), npes = nvshmem_n_pes();
    const int left = (me + npes - 1) % npes, right = (me + 1) % npes;
    unsigned long long begin, len, begin_b, len_b;  // this CTA's slices of the top and the bottom half
    slice_of(top_bytes, &begin, &len);
    slice_of(bottom_bytes, &begin_b, &len_b);
    const unsigned long long target = epoch * gridDim.x;
#define SLOT(src, half) (slots + ((unsigned long long)parity * npes + (src)) * (top_bytes + bottom_bytes) \
                         + ((half) ? top_bytes : 0))
#define SIGNAL(src, half) (signals + (((unsigned long long)parity * npes + (src)) * 2 + (half)))
    // Step 0: this PE's top half goes left, its bottom half right.
    put_slice(SLOT(me, 0) + begin, x + begin, len, SIGNAL(me, 0), left);
    put_slice(SLOT(me, 1) + begin_b, x + top_bytes + begin_b, len_b, SIGNAL(me, 1), right);
    // Steps 1 .. P-2: forward what arrived, once all of its CTAs' slices are there.
    for (int s = 1; s < npes - 1; ++s) {
        const int from_right = (me + s) % npes, from_left = (me + npes - s) % npes;
        if (threadIdx.x == 0) nvshmem_signal_wait_until(SIGNAL(from_right, 0), NVSHMEM_CMP_GE, target);
        __syncthreads();
        put_slice(SLOT(from_right, 0) + begin, SLOT(from_right, 0) + begin, len, SIGNAL(from_right, 0), left);
        if (threadIdx.x == 0) nvshmem_signal_wait_until(SIGNAL(from_left, 1), NVSHMEM_CMP_GE, target);
        __syncthreads();
        put_slice(SLOT(from_left, 1) + begin_b, SLOT(from_left, 1) + begin_b, len_b, SIGNAL(from_left, 1), right);
    }
    nvshmem_quiet();  // x may be overwritten once the kernel is done
}
"""

_METHODS = ("host", "kernel")
_DTYPES = ("float16", "bfloat16", "float32")
# A PE's refusal, by the code _local_problem finds: its message travels in the agreement.
_PROBLEMS = {
    1: "m, k and n must be positive ints",
    3: f"dtype must be one of {', '.join(_DTYPES)}",
    4: f"method must be one of {', '.join(_METHODS)}",
    5: "ctas must be a positive int (at most 2**31 - 1, a grid's width) or None",
    6: "the ring buffers (2 * P * m * k elements) and out (P * m x n) must fit an int64 of bytes",
}
DEFAULT_CTAS = 16
_serials = itertools.count(1)  # each plan's number in this process (the torch operator names it by it)


def _local_problem(m: Any, k: Any, n: Any, dtype: Any, method: Any, ctas: Any, *,
                   n_pes: int) -> tuple[int, str | None]:
    def positive(v: Any, limit: int = _args.INT64_MAX) -> bool:
        # At most `limit`: the values travel as int64s in the agreement, which would wrap a larger one.
        return isinstance(v, int) and not isinstance(v, bool) and 0 < v <= limit

    if not (positive(m) and positive(k) and positive(n)):
        return 1, None
    try:
        name = dtype_name(dtype)
    except (TypeError, ValueError):
        return 3, None
    if name not in _DTYPES:
        return 3, None
    if method not in _METHODS:
        return 4, None
    if ctas is not None and not positive(ctas, _args.INT_MAX):
        return 5, None
    size = itemsize(name)
    if 2 * n_pes * m * k * size > _args.INT64_MAX or n_pes * m * n * size > _args.INT64_MAX:
        return 6, None
    return 0, name


def _agreed(group: ProcessGroup, m: Any, k: Any, n: Any, dtype: Any, method: Any, ctas: Any) -> str:
    """The plan's arguments agreed by every PE of `group` (one fixed-size exchange): the dtype's name,
    or the same UsageError on every PE when any PE's are wrong or differ."""
    code, name = _local_problem(m, k, n, dtype, method, ctas, n_pes=group.nranks)
    failure = UsageError(_PROBLEMS[code]) if code else None
    values = [-1] * 6 if code else [m, k, n, _DTYPES.index(name or ""), _METHODS.index(method),
                                    0 if ctas is None else ctas]  # ints in an int64 once code is 0
    agree(group, "AllGatherMatmul", values, failure, described="arguments",
          names=("m", "k", "n", "dtype", "method", "ctas"))
    assert name is not None
    return name


def _framework(obj: Any) -> Any:
    """The module whose ``from_dlpack`` makes arrays like `obj` (torch, cupy): its class's top-level
    package, which is loaded already (nothing is imported on a class's say-so)."""
    root = _args.module_of(obj).split(".", 1)[0]
    module = sys.modules.get(root) if root else None
    if module is None or not hasattr(module, "from_dlpack"):
        raise UsageError(f"x is a {type(obj).__name__}; AllGatherMatmul needs arrays of a framework with "
                         "from_dlpack (PyTorch, CuPy)")
    return module


def _default_gemm(framework: Any) -> Callable[[Any, Any, Any], None]:
    if framework.__name__ == "torch":
        matmul = framework.matmul
        return lambda a, b, out: matmul(a, b, out=out)

    def gemm(a: Any, b: Any, out: Any) -> None:
        out[...] = a @ b

    return gemm


class AllGatherMatmul(Uncopyable):
    """The plan of ``out = all_gather(x) @ w`` for `m` rows of x per PE, `k` columns of x (rows of w)
    and `n` columns of w, of `dtype` (float16, bfloat16, float32). Collective: every PE makes it with
    the same arguments; it allocates ``2 * P * m * k`` elements of symmetric memory (two call
    parities), and, with ``method="kernel"``, compiles (cached) and loads the ring kernel.
    ``ctas`` is the kernel's CTA count: by default 16, or the largest grid whose CTAs are all
    resident where that is fewer (PEs sharing a GPU share its room), the same on every PE.
    It owns symmetric memory: ``copy.copy``, ``copy.deepcopy`` and pickling raise ``TypeError``."""

    m: int
    k: int
    n: int
    dtype: str
    method: str
    ctas: int
    n_pes: int
    pe: int

    def __init__(self, m: int, k: int, n: int, dtype: Any = "bfloat16", *, method: str = "host",
                 gemm: Callable[[Any, Any, Any], Any] | None = None, ctas: int | None = None) -> None:
        if nvshmem.runtime().limited_mpg:  # the same on every PE: refused alike, before anything collective
            raise UsageError("AllGatherMatmul needs NVSHMEM collectives, which its limited multi-PE-per-GPU mode "
                             "(PEs sharing a GPU without an MPS thread limit) lacks: run under CUDA MPS with "
                             "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE set, or with one PE per GPU")
        name = _agreed(NVSHMEMProcessGroup(), m, k, n, dtype, method, ctas)  # the same verdict on every PE
        self.m, self.k, self.n, self.dtype, self.method = m, k, n, name, method
        self.ctas = DEFAULT_CTAS if ctas is None else ctas
        self.n_pes, self.pe = nvshmem.n_pes(), nvshmem.my_pe()
        self._gemm = gemm
        # Each chunk travels as two halves, the top one of m // 2 rows (none for m = 1), the bottom one of the rest.
        self._top_bytes = (m // 2) * k * itemsize(name)
        self._chunk_bytes = m * k * itemsize(name)
        self._slots = nvshmem.empty((2, self.n_pes, m, k), name)
        self._signals = nvshmem.zeros((2, self.n_pes, 2), "uint64")
        self._epoch = 0  # calls made; odd and even calls use the two halves of the buffers
        self._round = 0
        self._views: dict[tuple[str, int, int, int], Any] = {}
        self._library: Any = None
        self._kernel: Any = None
        from cuda.core import Device, StreamOptions

        self._device = Device(nvshmem.device())
        self._device.set_current()
        self._comm = self._device.create_stream(options=StreamOptions(nonblocking=True, priority=-1))
        if method == "kernel":
            self._load_kernel()
            if ctas is None:  # what fits beside the other PEs on this GPU; the smallest of every PE's,
                # since each PE waits for its neighbours' puts counted per CTA (every PE takes this branch)
                fits = max(1, min(DEFAULT_CTAS, self._kernel.max_collective_grid(512)))
                self.ctas = smallest(NVSHMEMProcessGroup(), fits)
        nvshmem.barrier_all()  # every PE's buffers exist and are zeroed before any put
        self._closed = False
        self._serial = next(_serials)

    @property
    def serial(self) -> int:
        """This plan's number in the process (creation order)."""
        return self._serial

    @property
    def closed(self) -> bool:
        return getattr(self, "_closed", True)

    # Identity, spelled out: torch.compile takes an object as a constant only when its class defines
    # equality and hashing (mpbind.torch registers the classes its operators take).
    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    def _load_kernel(self) -> None:
        from mpbind import kernels as nk

        self._library = nk.compile(KERNEL_SOURCE, name="ag_ring").load()
        self._kernel = self._library.kernel(
            "ag_ring", nk.symmetric("slots"), nk.pointer("x"), nk.value("top_bytes", "uint64"),
            nk.value("bottom_bytes", "uint64"),
            nk.symmetric("signals", "uint64"), nk.value("epoch", "uint64"), nk.value("parity", "int32"),
            collective=True)

    # --- addresses ----------------------------------------------------------------------------

    def _slot(self, parity: int, src: int, half: int) -> int:
        return self._slots.ptr + (parity * self.n_pes + src) * self._chunk_bytes + (self._top_bytes if half else 0)

    def _signal(self, parity: int, src: int, half: int) -> int:
        return self._signals.ptr + ((parity * self.n_pes + src) * 2 + half) * 8

    def _rows(self, framework: Any, parity: int, src: int, half: int) -> Any:
        """x rows of PE `src` held here: one half (`half` 0 or 1) or the whole chunk (`half` 2)."""
        key = (framework.__name__, parity, src, half)
        view = self._views.get(key)
        if view is None:
            top = self.m // 2
            rows = (top, self.m - top, self.m)[half]
            code, bits = dlpack_code(self.dtype)
            ptr = self._slot(parity, src, 0 if half == 2 else half)
            view = framework.from_dlpack(_core.dlpack_view(ptr, [rows, self.k], code, bits, self._slots.device,
                                                           self._slots))
            self._views[key] = view
        return view

    # --- the call -----------------------------------------------------------------------------

    def _check(self, x: Any, w: Any, out: Any) -> int:
        """The checks of a call; returns x's address."""
        if self._closed:
            raise UsageError("this AllGatherMatmul is closed")
        xi = device_array(x, "x", dtype=self.dtype, contiguous=True)
        if xi.shape != (self.m, self.k):
            raise UsageError(f"x must be [{self.m}, {self.k}] (this PE's rows), got {list(xi.shape)}")
        wi = device_array(w, "w", dtype=self.dtype, contiguous=False)
        if wi.shape != (self.k, self.n):
            raise UsageError(f"w must be [{self.k}, {self.n}] (this PE's columns), got {list(wi.shape)}")
        oi = device_array(out, "out", dtype=self.dtype, writable=True, contiguous=True)
        if oi.shape != (self.n_pes * self.m, self.n):
            raise UsageError(f"out must be [{self.n_pes * self.m}, {self.n}], got {list(oi.shape)}")
        for name, info in (("x", xi), ("w", wi), ("out", oi)):
            if info.device not in (-2, self._slots.device):
                raise UsageError(f"{name} is on device {info.device}; this plan's PE uses device {self._slots.device}")
        return xi.ptr

    def __call__(self, x: Any, w: Any, out: Any = None, stream: Any = None) -> Any:
        """``out = all_gather(x) @ w`` on `stream` (default: the framework's current stream, else the
        default stream); returns `out` (allocated like ``x`` when not given). Collective."""
        framework = _framework(x)
        if out is None:
            if not hasattr(x, "new_empty"):
                raise UsageError("pass out= (an array of [P*m, n]) for arrays without new_empty()")
            out = x.new_empty((self.n_pes * self.m, self.n))
        x_ptr = self._check(x, w, out)
        if stream is None and framework.__name__ == "torch":
            stream = framework.cuda.current_stream()
        from cuda.core import Stream

        compute = Stream.from_handle(stream_handle(stream))
        gemm = self._gemm or _default_gemm(framework)
        self._epoch += 1
        parity = self._epoch % 2
        # Signals only grow: each call adds 1 per put (per CTA) to the signals of its parity.
        self._round = (self._epoch + 1) // 2
        # The ring starts after what the caller queued before (x is ready; the previous call's
        # GEMMs, which read the other parity, are queued before this one's on the same stream).
        self._comm.wait(compute.record())
        if self.method == "kernel":
            self._launch_ring(x_ptr, parity)
        else:
            self._host_ring(x_ptr, parity)
        self._gemms(framework, gemm, x, w, out, parity, compute)
        compute.wait(self._comm.record())  # x and the buffers are free once the caller's stream is past
        return out

    def _host_ring(self, x_ptr: int, parity: int) -> None:
        from mpbind.bindings import nvshmem as flat

        comm, top, epoch = int(self._comm.handle), self._top_bytes, self._round
        sizes = (top, self._chunk_bytes - top)
        left, right = (self.pe - 1) % self.n_pes, (self.pe + 1) % self.n_pes
        add, ge = int(flat.SignalOp.ADD), int(flat.CmpType.GE)

        def forward(src: int, half: int, source: int, pe: int) -> None:
            """Half `half` of PE `src`'s chunk, read at `source`, into its slot on `pe`, with its signal."""
            dst, signal = self._slot(parity, src, half), self._signal(parity, src, half)
            if sizes[half]:
                flat.putmem_signal_nbi_on_stream(dst, source, sizes[half], signal, 1, add, pe, comm)
            else:  # m = 1 has no top half; its signal still counts
                flat.signal_op_on_stream(signal, 1, add, pe, comm)

        forward(self.pe, 0, x_ptr, left)
        forward(self.pe, 1, x_ptr + top, right)
        for s in range(1, self.n_pes - 1):
            from_right, from_left = (self.pe + s) % self.n_pes, (self.pe - s) % self.n_pes
            flat.signal_wait_until_on_stream(self._signal(parity, from_right, 0), ge, epoch, comm)
            forward(from_right, 0, self._slot(parity, from_right, 0), left)
            flat.signal_wait_until_on_stream(self._signal(parity, from_left, 1), ge, epoch, comm)
            forward(from_left, 1, self._slot(parity, from_left, 1), right)
        flat.quiet_on_stream(comm)

    def _launch_ring(self, x_ptr: int, parity: int) -> None:
        self._kernel.launch_collective(self._slots, x_ptr, self._top_bytes, self._chunk_bytes - self._top_bytes,
                                       self._signals,
                                       self._round, parity, grid=self.ctas, block=512, stream=self._comm)

    def _gemms(self, framework: Any, gemm: Callable[[Any, Any, Any], Any], x: Any, w: Any, out: Any, parity: int,
               compute: Any) -> None:
        from mpbind.bindings import nvshmem as flat

        m, h, ge = self.m, self.m // 2, int(flat.CmpType.GE)
        target = self._round * (self.ctas if self.method == "kernel" else 1)
        stream = int(compute.handle)
        gemm(x, w, out[self.pe * m:(self.pe + 1) * m])
        for s in range(1, self.n_pes):
            from_right, from_left = (self.pe + s) % self.n_pes, (self.pe - s) % self.n_pes
            flat.signal_wait_until_on_stream(self._signal(parity, from_right, 0), ge, target, stream)
            if from_right == from_left:  # both halves of one chunk: one GEMM of all its rows
                flat.signal_wait_until_on_stream(self._signal(parity, from_left, 1), ge, target, stream)
                gemm(self._rows(framework, parity, from_right, 2), w, out[from_right * m:(from_right + 1) * m])
                continue
            if h:  # m = 1: no top half (its signal still comes)
                gemm(self._rows(framework, parity, from_right, 0), w, out[from_right * m:from_right * m + h])
            flat.signal_wait_until_on_stream(self._signal(parity, from_left, 1), ge, target, stream)
            gemm(self._rows(framework, parity, from_left, 1), w, out[from_left * m + h:(from_left + 1) * m])

    # --- lifetime -----------------------------------------------------------------------------

    def close(self) -> None:
        """Free the ring buffers (collective: every PE closes its plan) and unload the kernel."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._device.sync()
        self._views.clear()
        if self._library is not None:
            self._library.close()
        self._signals.free()
        self._slots.free()

    def __enter__(self) -> AllGatherMatmul:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if getattr(self, "_closed", True) else f"pe {self.pe} of {self.n_pes}"
        return (f"<AllGatherMatmul m={self.m} k={self.k} n={self.n} {self.dtype} method={self.method} {state}>")
