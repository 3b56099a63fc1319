"""A planned distributed matmul made of the layer's cuBLASMp objects (``mpbind.matmul.plan``).

The decisions are :mod:`mpbind.matmul._planner`'s, from values every rank passes alike. What only
this rank knows (its arrays' shapes, types and device, its GPU's compute capability) is checked
here, and the ranks agree on the outcome before anything else collective runs
(:func:`mpbind.process_group.agree` over the communicator: a digest of the plan's values and whether
this rank refused, which every rank sends unconditionally), then on their GPUs' compute capability
where the plan needs one. A refusal on one rank then raises on every rank, so that no rank goes on
into a grid creation or a workspace allocation another rank will never reach.

Then the plan is built from the existing layer: ``cublasmp.grid`` (cached grids), ``Matrix`` (its
descriptor on a replicated operand's view), ``MatmulDescriptor`` (transposes, epilogue, bias, aux
and scale pointers) and one ``Matmul`` whose workspace is the grid's shared one (``cublasMpMalloc``,
NCCL symmetric memory, registered on every grid the matmul touches: what the overlapped algorithms
need).
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from mpbind import _core, cublasmp, nccl
from mpbind._core import Composite
from mpbind._infra import args as _args
from mpbind._infra import cuda as _cuda
from mpbind._infra import interop as _interop
from mpbind._infra.owned import Owned, core_of
from mpbind.distributions import Distribution
from mpbind.errors import CudaError, UsageError
from mpbind.matmul._planner import EPILOGUES, ComputeCapabilityError, MatmulPlan, block_scale_elements
from mpbind.matmul._planner import plan as decide
from mpbind.process_group import NCCLProcessGroup, ProcessGroup, agree, digest, largest
from mpbind.typing import Array, Stream

__all__ = ["ComputeCapabilityError", "MatmulPlan", "PlannedMatmul", "plan"]

_SCALE_DTYPES = {"tensor": ("float32",), "mxfp8": ("float8_e8m0fnu", "uint8"), "nvfp4": ("float8_e4m3fn", "uint8")}
# The descriptor attribute holding each scale's pointer.
_SCALE_POINTERS = {"a": "a_scale_pointer", "b": "b_scale_pointer", "d": "d_scale_pointer", "amax_d": "amax_d_pointer"}


def plan(comm: nccl.Communicator, a: Array, b: Array, d: Array, *, a_dist: Distribution, b_dist: Distribution,
                d_dist: Distribution, c: Array | None = None, c_dist: Distribution | None = None,
                transa: bool = False, transb: bool = False, alpha: complex = 1.0, beta: complex = 0.0,
                epilogue: str | None = None, bias: Array | None = None, aux: Array | None = None,
                compute_type: cublasmp.CublasComputeType | int | None = None, scaling: str | None = None,
                scales: Mapping[str, Array] | None = None, handle: cublasmp.Handle | None = None,
                stream: Stream = None, algo_type: cublasmp.MatmulAlgoType | int | None = None,
                communication_sm_count: int | None = None,
                communication_type: str | cublasmp.CudaDataType | None = None) -> PlannedMatmul:
    """Plan ``D = alpha op(A) op(B) + beta C`` from how each matrix is spread over `comm`'s ranks.

    `a`, `b`, `d` (and `c`) are this rank's local pieces, column-major device arrays (a row-major
    ``x`` enters as ``x.T``); ``*_dist`` are :mod:`mpbind.distributions` values of the global
    (stored) matrices, the same on every rank: split by rows or columns (uniform or uneven),
    replicated, or 2-D block-cyclic. The plan picks cuBLASMp's algorithm (AllGather+GEMM,
    GEMM+ReduceScatter, GEMM+AllReduce where their layouts hold, a local product where no data need
    move, else the general one), the grids, the descriptors and block sizes, and the workspace
    (the grids' shared ``cublasMpMalloc`` memory); ``algorithm`` and ``explain()`` say which and why.

    `epilogue`: None, ``"bias"``, ``"relu"``, ``"relu_bias"``, ``"relu_aux"``, ``"relu_aux_bias"``,
    ``"gelu"``, ``"gelu_bias"``, ``"gelu_aux"``, ``"gelu_aux_bias"``, ``"drelu"``, ``"drelu_bgrad"``,
    ``"dgelu"``, ``"dgelu_bgrad"``, ``"bgrada"``, ``"bgradb"``; `bias` holds the entries of D's local
    rows (a bias gradient: all of them), `aux` the auxiliary matrix. FP8 (float8_e4m3fn x
    float8_e4m3fn or x float8_e5m2, TN) takes `scales` ``{"a", "b", "d", "amax_d"}``: device float32
    scalars (``scaling="tensor"``) or block scales (``"mxfp8"``, compute capability 10.0+).

    Communication settings: `algo_type` (a hint, e.g. ``SPLIT_P2P``, ``ATOMIC_P2P``, ``NO_OVERLAP``),
    `communication_sm_count` (SMs the overlapped algorithms give to communication) and
    `communication_type` (the type GEMM+ReduceScatter and GEMM+AllReduce send their partial
    products in: D's own type halves the traffic of the float32 default for 16-bit results).

    Every refusal is a ``UsageError`` (``ComputeCapabilityError`` for the GPU) raised on every rank
    alike before any grid, descriptor or workspace is made: the ranks first agree (one small
    all-gather) that each of them accepted the same plan. Collective: every rank calls it.
    """
    if not isinstance(comm, nccl.Communicator):
        raise TypeError(f"comm must be an mpbind.nccl.Communicator, not {type(comm).__name__}")
    rank = comm.rank
    arrays = {"a": a, "b": b, "c": c, "d": d}
    dists = {"a": a_dist, "b": b_dist, "c": c_dist, "d": d_dist}
    scales = dict(scales or {})
    failure: Exception | None = None
    the_plan: MatmulPlan | None = None
    capability: tuple[int, int] | None = None
    dtypes: dict[str, str] = {}
    try:
        infos = {name: _interop.device_array(x, name, writable=name == "d", contiguous=False)
                 for name, x in arrays.items() if x is not None}
        dtypes = {name: info.dtype for name, info in infos.items()}
        if (c is None) != (c_dist is None):
            raise UsageError("c and c_dist go together")
        the_plan = decide(a=a_dist, b=b_dist, c=c_dist, d=d_dist, a_dtype=dtypes["a"], b_dtype=dtypes["b"],
                        c_dtype=dtypes.get("c"), d_dtype=dtypes["d"], transa=transa, transb=transb, alpha=alpha,
                        beta=beta, epilogue=epilogue, compute_type=compute_type, scaling=scaling,
                        scales=tuple(scales), compute_capability=None, communication_type=communication_type)
        algo_type, communication_sm_count = _settings(algo_type, communication_sm_count)
        _check_local(the_plan, rank, comm.device, arrays, infos, bias, aux, scales)
        if the_plan.required_capability is not None:
            capability = _capability(comm.device)
    except (UsageError, TypeError, ValueError, OverflowError) as exc:  # every refusal is agreed, whatever its kind
        failure = exc
    values = digest(dists, dtypes, transa, transb, alpha, beta, epilogue, compute_type, scaling, sorted(scales),
                    bias is not None, aux is not None, _plain(algo_type), _plain(communication_sm_count),
                    _plain(communication_type))
    group = NCCLProcessGroup(comm)
    agree(group, "cublasmp.plan_matmul", values, failure, described="distributions, types and options")
    assert the_plan is not None  # agree raised otherwise
    if capability is not None:  # the same plan on every rank: every rank or none needs a capability
        _agree_on_capability(group, the_plan, capability)
    return PlannedMatmul._build(comm, the_plan, arrays, bias, aux, scales, handle, stream, algo_type,
                                communication_sm_count)


def _settings(algo_type: Any, sm_count: Any) -> tuple[cublasmp.MatmulAlgoType | None, int | None]:
    """The communication settings, checked before anything collective."""
    if algo_type is not None:
        if isinstance(algo_type, bool) or not isinstance(algo_type, int):
            raise TypeError(f"algo_type must be a cublasmp.MatmulAlgoType, not {type(algo_type).__name__}")
        try:
            algo_type = cublasmp.MatmulAlgoType(algo_type)
        except ValueError:
            raise UsageError(f"algo_type {algo_type} is not a cublasmp.MatmulAlgoType") from None
    if sm_count is not None:
        if isinstance(sm_count, bool) or not isinstance(sm_count, int):
            raise TypeError(f"communication_sm_count must be an int, not {type(sm_count).__name__}")
        if not 1 <= sm_count <= 2**31 - 1:
            raise UsageError(f"communication_sm_count must be >= 1; got {sm_count}")
    return algo_type, sm_count


def _plain(value: Any) -> Any:
    """An option as the same plain value on every rank (an enum member as its int)."""
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else value


# --- what only this rank knows --------------------------------------------------------------------


def _check_local(p: MatmulPlan, rank: int, device: int, arrays: dict[str, Array | None],
                 infos: dict[str, _interop.ArrayInfo], bias: Array | None, aux: Array | None,
                 scales: Mapping[str, Array]) -> None:
    """This rank's arrays against the plan: local shapes, column-major, device, dtypes (no library call)."""
    for o in p.operands:
        info = infos[o.name]
        expected = o.shape if o.distribution.replicated else o.given_shape(rank)
        if info.shape != expected:
            raise UsageError(f"{o.name}: rank {rank}'s local array is {_shape(info.shape)}; {o.distribution!r} gives "
                             f"it {_shape(expected)}")
        if info.shape[0] > 1 and info.strides[0] != 1:
            raise UsageError(f"{o.name} must be column-major (strides (1, lld)); got strides {info.strides} elements: "
                             "pass x.T for a row-major x")
        if info.device != device:
            raise UsageError(f"{o.name} is on device {info.device}; the communicator's is {device}")
        if info.dtype not in cublasmp.DATA_TYPES:
            raise UsageError(f"{o.name}: the layer's matrices have no {info.dtype} type")
        if o.views[rank] is not None and not hasattr(arrays[o.name], "__getitem__"):
            raise UsageError(f"{o.name} is replicated and hands over a slice: it must support x[r0:r1, c0:c1]")
    kind = EPILOGUES[p.epilogue]
    if p.bias_dtype is not None:
        _check_vector(bias, "bias", p.bias_dtype, p.bias_length(rank), device, writable=kind.bias == "out")
    elif bias is not None:
        raise UsageError(f"bias= is for an epilogue with a bias; the epilogue is {p.epilogue!r}")
    if kind.aux:
        if aux is None:
            raise UsageError(f"the {p.epilogue} epilogue needs aux= (its auxiliary matrix)")
        ld, cols, nbytes = p.aux_layout(rank)
        info = _interop.device_array(aux, "aux", writable=kind.aux == "out", contiguous=False)
        if info.nbytes < nbytes or info.device != device:
            raise UsageError(f"aux must hold {nbytes} bytes on device {device} (ld {ld} x {cols} columns); got "
                             f"{info.nbytes} bytes on device {info.device}")
    elif aux is not None:
        raise UsageError(f"aux= is for an epilogue with an auxiliary matrix; the epilogue is {p.epilogue!r}")
    _check_scales(p, rank, device, scales)


def _scale_piece(p: MatmulPlan, rank: int, name: str) -> tuple[int, tuple[str, ...]]:
    """(element count, dtypes) of the scale `name` at `rank`: one float32, or the block scales of
    this rank's piece of A or B."""
    if name in ("a", "b") and p.scaling in ("mxfp8", "nvfp4"):
        op = p.a if name == "a" else p.b
        k, outer = op.local_shape(rank)  # TN: K is the stored rows
        return block_scale_elements(outer, k, p.scaling), _SCALE_DTYPES[p.scaling]
    return 1, ("float32",)


def _check_scales(p: MatmulPlan, rank: int, device: int, scales: Mapping[str, Array]) -> dict[str, int]:
    """The scale arrays (named as planned) against the plan: types, element counts, device, amax_d
    writable; name -> pointer."""
    pointers: dict[str, int] = {}
    for name, array in scales.items():
        count, dtypes = _scale_piece(p, rank, name)
        info = _check_vector(array, f"scales[{name!r}]", dtypes, count, device, writable=name == "amax_d")
        pointers[name] = info.ptr
    return pointers


def _check_vector(array: Array | None, what: str, dtypes: str | tuple[str, ...], count: int, device: int,
                  writable: bool = False) -> _interop.ArrayInfo:
    if array is None:
        raise UsageError(f"{what} is required")
    allowed = (dtypes,) if isinstance(dtypes, str) else dtypes
    info = _interop.device_array(array, what, writable=writable)
    if info.dtype not in allowed or info.size != count or info.device != device:
        raise UsageError(f"{what} must be {count} contiguous {' or '.join(allowed)} on device {device}; got "
                         f"{info.size} {info.dtype} on device {info.device}")
    return info


def _shape(shape: tuple[int, ...]) -> str:
    return " x ".join(map(str, shape))


def _capability(device: int) -> tuple[int, int]:
    try:
        return _cuda.compute_capability(device)
    except CudaError as exc:  # a refusal like the others: agreed by every rank
        raise UsageError(f"cannot read device {device}'s compute capability ({exc})") from None


# --- agreeing ---------------------------------------------------------------------------------------


def _agree_on_capability(group: ProcessGroup, p: MatmulPlan, capability: tuple[int, int]) -> None:
    """ComputeCapabilityError on every rank, naming the first rank whose GPU is too old for the plan."""
    rows = group.allgather_ints([capability[0] * 10 + capability[1]])
    for r, (cc,) in enumerate(rows):
        p.require((cc // 10, cc % 10), f"rank {r}'s GPU")


# --- the plan, built --------------------------------------------------------------------------------


def _parts(matmul: cublasmp.Matmul | None, matrices: list[cublasmp.Matrix], own: list[Any]) -> Composite:
    """What a planned matmul owns, released together by ``close()``: its ``Matmul`` (and with it the
    matmul descriptor), its matrices (their descriptors), the per-rank communicator of a ``local``
    plan, and a handle it made. Grids and the shared workspace stay the grids' (cached)."""
    # Closed newest first: the matmul, the matrices, then a communicator and a handle.
    return Composite([*own, *matrices, *([matmul] if matmul is not None else [])], "planned matmul parts")


# The overlapped algorithms, by the plan's name for them (they cannot be captured: PlannedMatmul.capture).
_OVERLAPPED = {"allgather_gemm": "cuBLASMp's overlapped AllGather+GEMM",
               "gemm_reducescatter": "cuBLASMp's overlapped GEMM+ReduceScatter"}


class PlannedMatmul(Owned):
    """A distributed matmul planned from distributions: ``execute(a, b, d)`` runs it again on new
    local arrays of the planned shapes (one ``cublasMpMatmul``), ``capture()`` records it into a
    CUDA graph. ``algorithm`` and ``explain()`` say what was chosen and why."""

    _core: Composite
    plan: MatmulPlan

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("planned matmuls come from mpbind.matmul.plan()")

    @classmethod
    def _build(cls, comm: nccl.Communicator, p: MatmulPlan, arrays: dict[str, Array | None], bias: Array | None,
               aux: Array | None, scales: Mapping[str, Array], handle: cublasmp.Handle | None, stream: Stream,
               algo_type: cublasmp.MatmulAlgoType | int | None, sm_count: int | None) -> PlannedMatmul:
        self = cls.__new__(cls)
        self.plan = p
        self._rank = comm.rank
        self._device = comm.device
        self._algo_type = algo_type
        self._launch = None
        # pointers the descriptor holds (a launch cannot give new ones)
        self._fixed = [name for name, given in (("bias", bias), ("aux", aux)) if given is not None]
        self._fixed += [f"scales[{name!r}]" for name in scales]
        # execute(scales=): the planned pointers, restored after each call with others, and the lock
        # that keeps a call's repointing and launch from interleaving with another thread's
        self._scales = frozenset(p.scales)
        self._planned_scales = {name: _interop.array_info(array, name).ptr for name, array in scales.items()}
        self._scales_lock = threading.Lock() if p.scales else None
        own: list[Any] = []
        matrices: list[cublasmp.Matrix] = []
        m, n, k = p.gemm_shape(comm.rank)
        grid_comm = comm
        if p.algorithm == "local" and p.nranks > 1:
            alone = comm.split(color=comm.rank, key=0)  # collective; this rank's 1 x 1 grid lives on it
            assert alone is not None
            own.append(alone)
            grid_comm = alone
        if m == 0 or n == 0:  # a local product with nothing on this rank
            self._core = _parts(None, matrices, own)
            self._matmul = None
            self._matmul_plan = None
            self._matrices = {}
            return self
        if handle is None:
            handle = cublasmp.Handle(stream)
            own.insert(0, handle)
        views: dict[str, tuple[int, int, int, int]] = {}
        operands: dict[str, cublasmp.Matrix] = {}
        for o in p.operands:
            desc = o.desc(comm.rank)
            view = o.views[comm.rank]
            local = arrays[o.name]
            assert local is not None
            if view is not None:
                views[o.name] = view
                local = _slice(local, view)
            grid = cublasmp.grid(grid_comm, desc.nprow, desc.npcol, o.grid[2])
            operands[o.name] = cublasmp.Matrix(grid, local, shape=(desc.m, desc.n), block=(desc.mb, desc.nb),
                                               src=(desc.rsrc, desc.csrc))
            matrices.append(operands[o.name])
        descriptor = _descriptor(p, bias, aux, scales, comm.rank, algo_type, sm_count)
        is_complex = p.a.dtype.startswith("complex")
        compute = int(p.compute_type)
        alpha = cublasmp.scalar_bytes(p.alpha, compute, is_complex, "alpha")
        beta = cublasmp.scalar_bytes(p.beta, compute, is_complex, "beta")
        if p.algorithm != "local" and not p.uniform:
            _agree_on_workspace(NCCLProcessGroup(comm), handle, descriptor, operands, (m, n, k), alpha, beta)
        keep = (operands, descriptor, bias, aux, dict(scales))
        core = _core.cublasmp.MatmulPlan(
            handle, core_of(descriptor), m, n, k, alpha, operands["a"].operand(), operands["b"].operand(), beta,
            operands["c"].operand() if "c" in operands else None, operands["d"].operand(), None, keep, True)
        # the layer's Matmul over this plan: one grid per rank, or all ranks
        matmul = cublasmp.Matmul.from_core(core, m, n, k, descriptor,
                                           processes=1 if p.algorithm == "local" else p.nranks)
        self._core = _parts(matmul, matrices, own)
        self._matmul = matmul
        self._matmul_plan = core
        self._matrices = dict(operands)
        self._views = views
        self._shapes = {name: p.a.shape if name == "a" else p.b.shape if name == "b" else p.d.shape
                        for name in views}
        return self

    @property
    def algorithm(self) -> str:
        """``local``, ``allgather_gemm``, ``gemm_reducescatter``, ``gemm_allreduce`` or ``general``."""
        return self.plan.algorithm

    def explain(self) -> str:
        """Why this algorithm, its grids, blocks and memory: one line per decision."""
        return self.plan.explain()

    @property
    def local_shapes(self) -> dict[str, tuple[int, int]]:
        """Operand -> the local piece cuBLASMp works on at this rank (a replicated operand's slice)."""
        return self.plan.local_shapes(self._rank)

    @property
    def matmul(self) -> cublasmp.Matmul | None:
        """The layer's ``Matmul`` this plan runs (None on a rank with nothing to compute)."""
        return self._matmul

    @property
    def matrices(self) -> dict[str, cublasmp.Matrix]:
        """Operand name (``a``, ``b``, ``c``, ``d``) -> the ``cublasmp.Matrix`` describing this rank's
        piece to cuBLASMp (empty on a rank with nothing to compute). They stay the plan's."""
        return dict(self._matrices)

    @property
    def workspace_size(self) -> tuple[int, int]:
        """(device bytes, host bytes) cuBLASMp asked for at this rank."""
        return (0, 0) if self._matmul is None else self._matmul.workspace_size

    def execute(self, a: Array | None = None, b: Array | None = None, d: Array | None = None, c: Array | None = None,
                *, stream: Stream = None, scales: Mapping[str, Array] | None = None) -> None:
        """Run the matmul on `stream` (default: the handle's), on the planned arrays or on new local
        arrays of the same shapes, types and leading dimensions (a replicated operand: the whole
        array again). A captured plan replays what it recorded and refuses new arrays.

        `scales`: FP8 scales for this call instead of the planned ones, named exactly as planned
        (``a``, ``b``, ``d``, ``amax_d``) and checked as at planning (float32 scalars or block
        scales, on the plan's device; ``amax_d`` writable). The plan's own stay in place for later
        calls. A plan made without scales, and a captured plan, refuse them."""
        mm = self._matmul
        repointed = None if scales is None else self._given_scales(scales)  # checked on every rank
        if mm is None:
            return
        if self._views:
            given = {"a": a, "b": b, "c": c, "d": d}
            for name, view in self._views.items():
                x = given[name]
                if x is not None:
                    shape = tuple(getattr(x, "shape", ()))
                    if shape != self._shapes[name]:
                        raise UsageError(f"{name} is replicated: the new array must be {_shape(self._shapes[name])}, "
                                         f"not {shape}")
                    given[name] = _slice(x, view)
            a, b, c, d = given["a"], given["b"], given["c"], given["d"]
        lock = self._scales_lock
        if lock is None:  # no scales: nothing of the descriptor changes between calls
            mm.execute(stream, a=a, b=b, c=c, d=d)
            return
        with lock:  # a plan's calls with and without scales of their own never interleave
            if not repointed:
                mm.execute(stream, a=a, b=b, c=c, d=d)
                return
            # cuBLASMp reads the descriptor on the host while cublasMpMatmul enqueues the work (the
            # pointers go into the kernels' arguments then), so the planned pointers can go back as
            # soon as the call returns: work already queued keeps this call's.
            descriptor = mm.descriptor
            try:
                _repoint(descriptor, repointed)
                mm.execute(stream, a=a, b=b, c=c, d=d)
            finally:
                _repoint(descriptor, {name: self._planned_scales[name] for name in repointed})

    __call__ = execute

    def _given_scales(self, scales: Mapping[str, Array]) -> dict[str, int]:
        """The pointers of a call's scales, checked against the plan (name -> pointer; empty where
        each is the planned one)."""
        if not isinstance(scales, Mapping):
            raise TypeError(f"scales must be a mapping of name -> array, not {type(scales).__name__}")
        if scales.keys() != self._scales:
            got = ", ".join(sorted(_args.shown(name) for name in scales)) or "none"
            if not self._scales:
                raise UsageError(f"the matmul ({self._described()}) was planned without scales, so a call takes none; "
                                 f"given: {got}")
            raise UsageError(f"scales must name exactly the planned ones ({', '.join(map(repr, self.plan.scales))}); "
                             f"given: {got}")
        if not scales:
            return {}
        if self.closed:
            raise UsageError("PlannedMatmul is closed")
        if self.captured:
            raise UsageError("a captured matmul replays the scales it recorded; scales of a call need a plan that is "
                             "not captured")
        pointers = _check_scales(self.plan, self._rank, self._device, scales)
        planned = self._planned_scales
        return {name: ptr for name, ptr in pointers.items() if ptr != planned[name]}

    def scale_pieces(self) -> dict[str, tuple[int, tuple[str, ...]]]:
        """Scale name -> (element count, allowed dtypes) of the arrays ``execute(scales=)`` takes at this
        rank: a float32 scalar, or the block scales of this rank's piece of A or B (``amax_d``, a
        float32 scalar, is written). Empty for a plan without scales."""
        pieces = self.__dict__.get("_scale_shapes")
        if pieces is None:  # the plan and the rank never change: worked out once (the operators' hot path)
            pieces = self._scale_shapes = {name: _scale_piece(self.plan, self._rank, name) for name in self.plan.scales}
        return dict(pieces)

    def capture(self, stream: Stream = None) -> PlannedMatmul:
        """Record the call into a CUDA graph on `stream` (every rank captures; replayed by ``execute()``).
        Returns self.

        AllGather+GEMM and GEMM+ReduceScatter are captured only when planned with
        ``algo_type=MatmulAlgoType.NO_OVERLAP``: cuBLASMp 0.10's overlapped versions do not replay
        from a graph (on two H200s a first capture in a process failed with INTERNAL_ERROR, and a
        graph captured after an eager run gave wrong results from its second replay on). Refused
        here, the same on every rank, before anything is recorded."""
        if self.plan.algorithm in _OVERLAPPED and self._algo_type != cublasmp.MatmulAlgoType.NO_OVERLAP:
            raise UsageError(f"{_OVERLAPPED[self.plan.algorithm]} does not replay correctly from a CUDA graph in "
                             "cuBLASMp 0.10: to capture it, plan with algo_type=cublasmp.MatmulAlgoType.NO_OVERLAP "
                             "(or run it eagerly with execute())")
        if self._matmul_plan is not None:
            # The plan knows its algorithm (the thin Matmul cannot, and refuses every multi-process
            # capture without NO_OVERLAP): the check above is the one that applies, so the core
            # plan's capture is called, not the Matmul's. Under the scales' lock: the graph records
            # the planned scales, never another thread's call's.
            if self._scales_lock is None:
                self._matmul_plan.capture(stream)
            else:
                with self._scales_lock:
                    self._matmul_plan.capture(stream)
        return self

    @property
    def captured(self) -> bool:
        return self._matmul is not None and self._matmul.captured

    def _described(self) -> str:
        return f"{self.plan.algorithm} {self.plan.m} x {self.plan.n} x {self.plan.k}"

    def launch_pieces(self) -> dict[str, tuple[tuple[int, int], str]]:
        """Operand name -> (shape, dtype) of the local array this rank's launches are given: the
        column-major array ``execute`` takes (a replicated operand: the whole array), packed
        (leading dimension = rows)."""
        pieces = self.__dict__.get("_pieces")
        if pieces is None:  # the plan and the rank never change: worked out once (the operators' hot path)
            pieces = self._pieces = {o.name: (o.given_shape(self._rank), o.dtype) for o in self.plan.operands}
        return dict(pieces)

    @property
    def launch_id(self) -> int:
        """The id a framework's compiled program names this plan by (the XLA FFI handlers of
        :mod:`mpbind.jax`): registered on first use, released when the plan is collected. A launch
        is given packed local arrays (:meth:`launch_pieces`), so the plan must have been made on
        packed ones; bias, aux and scales stay the planned ones (their pointers are in the
        descriptor), so a plan with any of them is refused, as is a captured one. A launch of a
        closed plan fails with an error naming it."""
        if self._launch is None:
            if self.closed:
                raise UsageError("PlannedMatmul is closed")
            if self._fixed:
                raise UsageError(f"a planned matmul with {', '.join(self._fixed)} cannot be launched from a compiled "
                                 "program: the descriptor holds their pointers, and a launch gives new arrays")
            launch = int(_core.cublasmp.launch_register_matmul(self._matmul_plan, self._device, self._slots()))
            weakref.finalize(self, _core.cublasmp.launch_release, launch)
            self._launch = launch
        return self._launch

    def _slots(self) -> list[tuple[bool, int, int]]:
        """(used, offset, bytes) of the array a launch gets for a, b, c, d: packed local arrays, a
        replicated operand's piece at its view's offset."""
        slots = [(False, 0, 0)] * 4
        for o in self.plan.operands:
            rows, cols = o.given_shape(self._rank)
            size = _interop.itemsize(o.dtype)
            offset = 0
            if o.name in self._matrices:
                info = self._matrices[o.name].info
                lld = info.strides[1] if info.shape[1] > 1 else rows
                if lld != rows and rows * cols:
                    raise UsageError(f"{o.name} was planned on an array with leading dimension {lld}, not its {rows} "
                                     "rows: a launch is given packed arrays, so plan on packed ones")
                view = self._views.get(o.name)
                if view is not None:
                    offset = (view[2] * rows + view[0]) * size
            slots["abcd".index(o.name)] = (True, offset, rows * cols * size)
        return slots

    _rank: int
    _device: int
    _launch: int | None
    _fixed: list[str]
    _pieces: dict[str, tuple[tuple[int, int], str]]
    _scales: frozenset[str]
    _planned_scales: dict[str, int]
    _scales_lock: threading.Lock | None
    _scale_shapes: dict[str, tuple[int, tuple[str, ...]]]
    _algo_type: cublasmp.MatmulAlgoType | int | None
    _matmul: cublasmp.Matmul | None
    _matmul_plan: Any  # the core's MatmulPlan under _matmul, or None
    _matrices: dict[str, cublasmp.Matrix]
    _views: dict[str, tuple[int, int, int, int]]
    _shapes: dict[str, tuple[int, int]]


def _agree_on_workspace(group: ProcessGroup, handle: cublasmp.Handle, descriptor: cublasmp.MatmulDescriptor,
                        operands: dict[str, cublasmp.Matrix], mnk: tuple[int, int, int], alpha: bytes,
                        beta: bytes) -> None:
    """Take the shared workspace of D's grid at the largest size any rank needs, on every rank.

    cuBLASMp sizes the workspace from this rank's pieces; where they differ between ranks (uneven
    splits) the sizes may too. The shared workspace is allocated and registered collectively, and
    whether a plan reuses it or grows it follows from the size asked: asked at different sizes,
    one rank could grow it (a collective ``cublasMpMalloc``) while another reuses it, and wait
    forever. Asked here at one size everywhere, the plan then finds it large enough on every rank."""
    mine = _device_bytes(handle, descriptor, operands, mnk, alpha, beta)
    agreed = largest(group, mine)
    if agreed > 0:
        workspace = _core.cublasmp.shared_workspace(operands["d"].grid, agreed)
        workspace.serve([o.grid for o in operands.values()])  # every rank, even one that needs none itself


def _device_bytes(handle: cublasmp.Handle, descriptor: cublasmp.MatmulDescriptor, operands: dict[str, cublasmp.Matrix],
                  mnk: tuple[int, int, int], alpha: bytes, beta: bytes) -> int:
    """``cublasMpMatmul_bufferSize``'s device bytes at this rank."""
    from mpbind.bindings import cublasmp as flat

    scalars = ctypes.create_string_buffer(alpha + beta, len(alpha) + len(beta))
    at = ctypes.addressof(scalars)

    def operand(name: str) -> tuple[int, int, int, Any]:
        o = operands.get(name)
        return (0, 1, 1, 0) if o is None else (o.ptr, 1, 1, o.descriptor.ptr)

    device, _ = flat.matmul_buffer_size(handle.ptr, descriptor.ptr, *mnk, at, *operand("a"), *operand("b"),
                                        at + len(alpha), *operand("c"), *operand("d"))
    return int(device)


def _repoint(descriptor: cublasmp.MatmulDescriptor, pointers: Mapping[str, int]) -> None:
    """Point the descriptor's scale attributes at `pointers` (name -> address). The caller holds the
    plan's scales lock."""
    for name, ptr in pointers.items():
        setattr(descriptor, _SCALE_POINTERS[name], ptr)


def _slice(array: Any, view: tuple[int, int, int, int]) -> Any:
    r0, r1, c0, c1 = view
    return array[r0:r1, c0:c1]


def _descriptor(p: MatmulPlan, bias: Array | None, aux: Array | None, scales: Mapping[str, Array], rank: int,
                algo_type: cublasmp.MatmulAlgoType | int | None, sm_count: int | None) -> cublasmp.MatmulDescriptor:
    """The matmul descriptor of the plan: transposes, epilogue, and the pointers it reads or writes."""
    CO = cublasmp.CublasOperation
    desc = cublasmp.MatmulDescriptor(p.compute_type, transa=CO.T if p.transa else CO.N,
                                     transb=CO.T if p.transb else CO.N, epilogue=p.epilogue_member)
    if algo_type is not None:
        desc.algo_type = algo_type
    if sm_count is not None:
        desc.communication_sm_count = sm_count
    types = cublasmp.DATA_TYPES
    if p.communication_dtype is not None:
        desc.communication_type = types[p.communication_dtype]
    if bias is not None and p.bias_dtype is not None:
        desc.bias_pointer = _interop.array_info(bias, "bias").ptr
        desc.bias_data_type = types[p.bias_dtype]
        if EPILOGUES[p.epilogue].bias == "out":  # the scheme says what becomes of a gradient written; a read has none
            desc.bias_result_scheme = cublasmp.ResultScheme.FULL  # a bias gradient comes out whole on every rank
    if aux is not None:
        ld, _, _ = p.aux_layout(rank)
        desc.epilogue_aux_pointer = _interop.array_info(aux, "aux").ptr
        desc.epilogue_aux_ld = ld
        if p.aux_dtype is not None:
            desc.epilogue_aux_data_type = types[p.aux_dtype]
    mode = p.scale_mode
    for name, array in scales.items():
        setattr(desc, _SCALE_POINTERS[name], _interop.array_info(array, name).ptr)
        if name == "amax_d":
            continue
        assert mode is not None
        setattr(desc, f"{name}_scale_mode", mode if name in ("a", "b") else cublasmp.MatmulMatrixScale.SCALAR_FP32)
    return desc
