"""The guards the roles render (roles.py `guard()`), the init check emit_python renders from the IR, and
the spec attributes behind them (`non_null`, [init]): what each produces for one parameter of each kind."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

Generator = Callable[[str], ModuleType]


@pytest.fixture(scope="module")
def libs(generate: ModuleType) -> dict[str, Any]:
    return {name: generate.load_library(name) for name in ("nccl", "nvshmem", "cufftmp")}


def _role(generator: Generator, lib: Any, function: str, param: str) -> Any:
    f = lib.function(function)
    return generator("roles").bind(lib, f, f.param(param))


def _rendered(generator: Generator, lib: Any, function: str) -> list[str]:
    """The function's lines in the rendered modules (the library's and its private ones), from its
    def to the next top-level line."""
    emit_python = generator("emit_python")
    module = "\n".join(emit_python.python_modules(lib).values()).splitlines()
    python = lib.function(function).python
    start = module.index(next(line for line in module if line.startswith(f"def {python}(")))
    end = next(i for i in range(start + 1, len(module)) if module[i][:1] not in ("", " "))
    return module[start:end]


# (library, function, parameter) -> (its Python declaration, its guard)
GUARDS = {
    ("nccl", "ncclAllReduce", "sendbuff"): (
        "sendbuff", ['cdef intptr_t _h_sendbuff = _as_address(sendbuff, "sendbuff", 0)']),
    ("nccl", "ncclAllReduce", "comm"): ("comm", ['cdef intptr_t _h_comm = _as_address(comm, "comm", 0)']),
    ("nccl", "ncclTeamWorld", "comm"): ("comm", ['cdef intptr_t _h_comm = _as_address(comm, "comm", 1)']),
    ("nccl", "ncclGetLastError", "comm"): (
        "comm", ['cdef intptr_t _h_comm = 0 if comm is None else _as_address(comm, "comm", 0)']),
    ("nccl", "ncclAllReduce", "count"): (
        "count", ["if not _is_int(count):", '    count = _int_arg(count, "count")', "cdef size_t _c_count = count"]),
    ("nccl", "ncclAllReduce", "datatype"): (
        "datatype", ["if not _is_int(datatype):", '    datatype = _int_arg(datatype, "datatype")',
                     "cdef int _c_datatype = datatype"]),
    # `minimum` in the spec: an int the library divides by or crashes on below it.
    ("nccl", "ncclCommInitAll", "ndev"): (
        "ndev", ["if not _is_int(ndev):", '    ndev = _int_arg(ndev, "ndev")', "if ndev < 1:",
                 '    raise _UsageError("ndev must be >= 1, got %d" % ndev)', "cdef int _c_ndev = ndev"]),
    ("nvshmem", "nvshmem_team_my_pe", "team"): (
        "team", ["if not _is_int(team):", '    team = _int_arg(team, "team")', "cdef int32_t _c_team = team"]),
    ("cufftmp", "cufftMpDestroyReshape", "handle"): (
        "handle", ['cdef intptr_t _h_handle = _as_address(handle, "handle", 1)']),
    # Floats and bools are converted by the signature, as before: no guard.
    ("nvshmem", "nvshmemx_double_atomic_add", "value"): ("double value", []),
    # A struct or string checks its type in its guard (_as_<Class>, _to_bytes); its conversion
    # takes its data or address.
    ("nccl", "ncclCommInitRank", "commId"): ("comm_id", ['_o_commId = _as_UniqueId(comm_id, "comm_id")']),
    ("nccl", "ncclCommShrink", "config"): (
        "config", ["if config is not None:", '    _o_config = _as_Config(config, "config")']),
}


@pytest.mark.parametrize("key", GUARDS, ids=lambda k: f"{k[1]}.{k[2]}")
def test_each_role_renders_its_guard(generator: Generator, libs: dict[str, Any], key: tuple[str, str, str]) -> None:
    lib_name, function, param = key
    role = _role(generator, libs[lib_name], function, param)
    decl, guard = GUARDS[key]
    pp = role.python_param()
    assert pp is not None and pp.decl == decl
    assert role.guard() == guard


def test_guarded_arguments_reach_c_through_their_checked_locals(generator: Generator, libs: dict[str, Any]) -> None:
    lines = _rendered(generator, libs["nccl"], "ncclAllReduce")
    assert lines[0] == "def all_reduce(sendbuff, recvbuff, count, datatype, op, comm, stream):"
    call = next(line.strip() for line in lines if "ncclAllReduce(" in line and "__status__ =" in line)
    assert call == ("__status__ = ncclAllReduce(<const void*>_h_sendbuff, <void*>_h_recvbuff, _c_count, "
                    "<ncclDataType_t>_c_datatype, <ncclRedOp_t>_c_op, <ncclComm_t>_h_comm, <cudaStream_t>_h_stream)")


def test_every_guard_runs_before_any_conversion(generator: Generator, libs: dict[str, Any]) -> None:
    # ncclCommShrink (hoisted declarations, a try): every guard (the struct's type check too)
    # before the array is copied and the struct's address taken.
    lines = [line.strip() for line in _rendered(generator, libs["nccl"], "ncclCommShrink")]
    guards = [lines.index('_h_comm = _as_address(comm, "comm", 0)'),
              lines.index('_o_config = _as_Config(config, "config")'), lines.index("_c_shrinkFlags = shrink_flags")]
    first_conversion = min(i for i, line in enumerate(lines) if "PyMem_Malloc" in line or "_p_config = &" in line)
    assert guards == sorted(guards) and guards[-1] < first_conversion


def test_the_init_check_follows_the_guards_and_precedes_the_call(generator: Generator,
                                                                 libs: dict[str, Any]) -> None:
    lines = [line.strip() for line in _rendered(generator, libs["nvshmem"], "nvshmemx_putmem_on_stream")]
    check = lines.index("if nvshmemx_init_status() < 2:")
    assert lines[check + 1] == '_not_initialized("nvshmemx_putmem_on_stream", 2)'
    assert max(i for i, line in enumerate(lines) if "_as_address" in line or "_int_arg" in line) < check
    # putmem on a stream keeps the GIL (an enqueue): the call is the _internal entry point itself
    call = next(i for i, line in enumerate(lines) if line.startswith("_nvshmem._nvshmemx_putmem_on_stream("))
    assert check < call and "with nogil:" not in lines
    assert "Needs nvshmemx_init_status() >= IS_INITIALIZED (else NVSHMEMNotInitializedError)." in lines


@pytest.mark.parametrize(("function", "needed"), [
    ("nvshmem_my_pe", None), ("nvshmemx_init_status", None), ("nvshmemx_get_uniqueid", None),
    ("nvshmem_malloc", 2), ("nvshmem_barrier_all", 2), ("nvshmemx_hostlib_finalize", 2),
    ("nvshmem_quiet", 2), ("nvshmemx_double_atomic_add", 2), ("nvshmem_team_my_pe", 2), ("nvshmem_global_exit", 2),
])
def test_the_init_check_needs_what_the_spec_says(generator: Generator, libs: dict[str, Any], function: str,
                                                 needed: int | None) -> None:
    checks = [line.strip() for line in _rendered(generator, libs["nvshmem"], function)
              if "nvshmemx_init_status() <" in line]
    assert checks == ([] if needed is None else [f"if nvshmemx_init_status() < {needed}:"])


def test_libraries_without_an_init_spec_have_no_init_check(generator: Generator, libs: dict[str, Any]) -> None:
    assert libs["nccl"].init_check is None
    assert "_not_initialized" not in generator("emit_python").python_pyx(libs["nccl"])


def test_every_nvshmem_function_but_the_listed_ones_needs_an_initialised_runtime(libs: dict[str, Any]) -> None:
    lib = libs["nvshmem"]
    anytime = {f.name for f in lib.bound if f.needs_init is None}
    assert anytime == {
        "nvshmem_init", "nvshmem_init_thread", "nvshmemx_init_attr", "nvshmemx_hostlib_init_attr",
        "nvshmemid_hostlib_init_attr", "nvshmemx_init_status", "nvshmemid_init_status", "nvshmem_query_thread",
        "nvshmem_info_get_version", "nvshmem_info_get_name", "nvshmemx_vendor_get_version_info", "nvshmem_my_pe",
        "nvshmem_n_pes", "nvshmemx_get_uniqueid", "nvshmemx_set_attr_uniqueid_args",
        "nvshmemx_set_attr_mpi_comm_args"}
    assert {f.needs_init for f in lib.bound} == {None, "NVSHMEM_STATUS_IS_INITIALIZED"}


def test_the_dispatchers_refuse_none(generator: Generator, libs: dict[str, Any]) -> None:
    pyx = generator("emit_python").python_pyx(libs["nvshmem"])
    assert "    if dtype is None:  # numpy.dtype(None) is float64: never a guess\n" in pyx


def test_struct_from_ptr_and_setters_are_guarded(generator: Generator, libs: dict[str, Any]) -> None:
    lines = "\n".join(generator("emit_structs").struct_class(libs["nccl"], libs["nccl"].structs["ncclConfig_t"]))
    assert 'cdef intptr_t _h_address = _as_address(address, "Config.from_ptr: address", 1)' in lines
    assert '    @blocking.setter\n    def blocking(self, value):\n        if not _is_int(value):\n' \
           '            value = _int_arg(value, "blocking")\n        self._data.blocking = value' in lines


# -- the spec --------------------------------------------------------------------------------------

def _nvshmem_enums(generator: Generator) -> dict[str, Any]:
    enums = generator("generate").load_ir("nvshmem")["enums"]
    return {"enums": [{"name": e["name"], "values": e["values"]} for e in enums]}


def test_the_init_spec_gives_each_listed_function_its_status(generator: Generator) -> None:
    model = generator("model")
    needs = model._init_needs(model.Spec.load("nvshmem"), _nvshmem_enums(generator))
    assert needs["nvshmem_my_pe"] is None  # the lowest status: callable at any time
    assert "nvshmem_malloc" not in needs and "nvshmem_quiet" not in needs  # [init] default


def test_an_init_spec_naming_an_unknown_status_is_refused(generator: Generator) -> None:
    model = generator("model")
    spec = model.Spec.load("nvshmem")
    spec.init = {**spec.init, "default": "NVSHMEM_STATUS_READY"}
    with pytest.raises(ValueError, match="NVSHMEM_STATUS_READY is not a member of nvshmemx_init_status_t"):
        model._init_needs(spec, _nvshmem_enums(generator))


def test_an_init_spec_listing_a_function_twice_is_refused(generator: Generator) -> None:
    model = generator("model")
    spec = model.Spec.load("nvshmem")
    needs = dict(spec.init["needs"])
    needs["NVSHMEM_STATUS_IS_BOOTSTRAPPED"] = ["nvshmem_malloc", "nvshmem_my_pe"]
    spec.init = {**spec.init, "needs": needs}
    with pytest.raises(ValueError, match="lists nvshmem_my_pe twice"):
        model._init_needs(spec, _nvshmem_enums(generator))


def test_the_status_function_itself_must_be_callable_at_any_time(generator: Generator) -> None:
    model = generator("model")
    spec = model.Spec.load("nvshmem")
    needs = {k: [n for n in v if n != "nvshmemx_init_status"] for k, v in spec.init["needs"].items()}
    spec.init = {**spec.init, "needs": needs}
    with pytest.raises(ValueError, match="nvshmemx_init_status must be callable at any status"):
        model._init_needs(spec, _nvshmem_enums(generator))


def test_non_null_is_refused_on_a_parameter_that_is_no_handle(generator: Generator) -> None:
    model = generator("model")
    ir = generator("generate").load_ir("nccl")
    f = next(f for f in ir["functions"] if f["name"] == "ncclMemAlloc")
    next(p for p in f["params"] if p["name"] == "size")["non_null"] = True
    with pytest.raises(ValueError, match="ncclMemAlloc.size: non_null is for a pointer or handle"):
        model._check_roles(ir)


def test_minimum_is_refused_on_a_parameter_that_is_no_int_value(generator: Generator) -> None:
    model = generator("model")
    ir = generator("generate").load_ir("nccl")
    f = next(f for f in ir["functions"] if f["name"] == "ncclAllReduce")
    next(p for p in f["params"] if p["name"] == "sendbuff")["minimum"] = 1
    with pytest.raises(ValueError, match="ncclAllReduce.sendbuff: minimum is for an int passed by value"):
        model._check_roles(ir)


def test_golden_files_exist_for_the_guard_patterns() -> None:
    golden = Path(__file__).resolve().parent / "golden"
    assert (golden / "ncclAllReduce.txt").is_file() and (golden / "ncclTeamWorld.txt").is_file()
