# mypy: disable-error-code="arg-type,list-item"
# (these tests pass wrongly typed arguments on purpose)
"""Real calls into libnccl that work without a GPU."""

from __future__ import annotations

import ctypes
import importlib.metadata
import pickle
from typing import Any

import pytest

from mpbind._infra import loader as _loader
from mpbind._infra.info import gpu_count
from mpbind.bindings import _status, nccl
from mpbind.errors import NCCLError, NCCLInvalidArgumentError, UsageError

UID_BYTES = 128


def _installed(wheel: str) -> str | None:
    try:
        return importlib.metadata.version(wheel)
    except importlib.metadata.PackageNotFoundError:
        return None


# --- version -------------------------------------------------------------------------------


def test_get_version_matches_ctypes() -> None:
    version = nccl.get_version()
    assert isinstance(version, int)
    lib = ctypes.CDLL(_loader.load("nccl").path)
    out = ctypes.c_int(0)
    assert lib.ncclGetVersion(ctypes.byref(out)) == 0
    assert version == out.value
    assert _loader.loaded_version("nccl") == _loader.format_version("nccl", version)


def test_get_version_of_pinned_wheel(pins: dict[str, Any], installed: dict[str, Any]) -> None:
    pin = installed["nccl"]  # the library of this environment's wheel family
    if _installed(pin.wheel) != pin.version:
        pytest.skip(f"{pin.wheel} {pin.version} is not installed (found {_installed(pin.wheel)})")
    if not _loader.load("nccl").path.endswith("nvidia/nccl/lib/libnccl.so.2"):
        pytest.skip("libnccl is not loaded from the wheel here")
    major, minor, patch = pin.parts
    assert nccl.get_version() == major * 10000 + minor * 100 + patch
    assert _loader.loaded_version("nccl") == pin.version
    # the constants are the headers' the bindings are generated from
    major, minor, patch = pins["nccl"].parts
    assert nccl.VERSION_CODE == major * 10000 + minor * 100 + patch
    assert (nccl.MAJOR, nccl.MINOR, nccl.PATCH) == pins["nccl"].parts


# --- unique id -----------------------------------------------------------------------------


def test_unique_id_is_128_bytes() -> None:
    uid = nccl.get_unique_id()
    assert isinstance(uid, nccl.UniqueId)
    assert len(uid) == UID_BYTES
    assert uid.nbytes == UID_BYTES
    assert nccl.UNIQUE_ID_BYTES == UID_BYTES
    raw = bytes(uid)
    assert isinstance(raw, bytes)
    assert len(raw) == UID_BYTES
    assert raw != bytes(UID_BYTES)
    view = memoryview(uid)
    assert view.nbytes == UID_BYTES
    assert view.readonly
    assert view.tobytes() == raw
    assert uid.ptr != 0
    assert ctypes.string_at(uid.ptr, UID_BYTES) == raw


def test_unique_ids_differ() -> None:
    a = nccl.get_unique_id()
    b = nccl.get_unique_id()
    assert a != b
    assert bytes(a) != bytes(b)


def test_unique_id_pickles_and_round_trips() -> None:
    uid = nccl.get_unique_id()
    clone = pickle.loads(pickle.dumps(uid))
    assert type(clone) is nccl.UniqueId
    assert clone == uid
    assert hash(clone) == hash(uid)
    assert bytes(clone) == bytes(uid)
    for data in (bytes(uid), bytearray(bytes(uid)), memoryview(bytes(uid))):
        again = nccl.UniqueId(data)
        assert again == uid
        assert bytes(again) == bytes(uid)
    assert {uid, clone} == {uid}
    assert uid != bytes(uid)  # only UniqueIds compare equal to UniqueIds


def test_unique_id_default_is_zero() -> None:
    assert bytes(nccl.UniqueId()) == bytes(UID_BYTES)


@pytest.mark.parametrize("size", [0, 1, 127, 129, 256])
def test_unique_id_wrong_length(size: int) -> None:
    with pytest.raises(UsageError, match="128"):
        nccl.UniqueId(b"\x01" * size)


@pytest.mark.parametrize("value", [1.5, object(), "x" * 128, 128, 5])
def test_unique_id_wrong_type(value: object) -> None:
    # An int must not be taken as a length (bytes(128) would be 128 zero bytes).
    with pytest.raises(TypeError):
        nccl.UniqueId(value)  # type: ignore[arg-type]


def test_comm_init_takes_bytes_uid_of_wrong_length() -> None:
    with pytest.raises(UsageError):
        nccl.comm_init_rank(1, b"short", 0)
    with pytest.raises(TypeError):
        nccl.comm_init_rank(1, "x" * 128, 0)  # type: ignore[arg-type]


# --- error strings -------------------------------------------------------------------------


@pytest.mark.parametrize("result", list(nccl.Result), ids=lambda r: r.name)
def test_get_error_string(result: nccl.Result) -> None:
    text = nccl.get_error_string(result)
    assert isinstance(text, str)
    assert text


def test_get_error_string_accepts_ints() -> None:
    assert nccl.get_error_string(4) == nccl.get_error_string(nccl.Result.INVALID_ARGUMENT)
    assert nccl.get_error_string(7) == nccl.get_error_string(nccl.Result.IN_PROGRESS)
    assert isinstance(nccl.get_error_string(12345), str)


def test_enum_values() -> None:
    assert nccl.DataType.FLOAT32 == 7
    assert nccl.DataType.FLOAT == nccl.DataType.FLOAT32
    assert nccl.DataType.BFLOAT16 == 9
    assert nccl.RedOp.SUM == 0
    assert nccl.RedOp.MAX == 2
    assert nccl.Result.SUCCESS == 0
    assert nccl.Result.IN_PROGRESS == 7
    assert nccl.Result(4) is nccl.Result.INVALID_ARGUMENT
    assert nccl.SPLIT_NOCOLOR == -1
    assert nccl.CONFIG_UNDEF_INT == -(2**31)


# --- communicator init without a GPU -------------------------------------------------------


def test_comm_init_rank_without_gpu_raises_typed_error() -> None:
    count, _ = gpu_count()
    if count > 0:
        pytest.skip("a GPU is visible: ncclCommInitRank would succeed")
    uid = nccl.get_unique_id()
    with pytest.raises(NCCLError) as info:
        nccl.comm_init_rank(1, uid, 0)
    err = info.value
    cls = type(err)
    assert cls is not NCCLError
    assert cls.status_code == err.status
    assert cls is _status._CLASSES["nccl"][err.status]
    assert err.status != nccl.Result.IN_PROGRESS
    assert err.function == "ncclCommInitRank"
    assert err.library == "nccl"
    name = _status._NAMES["nccl"][err.status]
    assert err.status_name == name
    assert name in str(err)
    library_text = nccl.get_error_string(err.status)
    assert library_text
    assert err.description == library_text
    assert library_text in str(err)
    clone = pickle.loads(pickle.dumps(err))
    assert type(clone) is cls
    assert str(clone) == str(err)


# --- structs -------------------------------------------------------------------------------


def test_config_defaults() -> None:
    c = nccl.Config()
    undef = nccl.CONFIG_UNDEF_INT
    assert c.size == c.nbytes
    assert c.magic == nccl.API_MAGIC
    assert c.version == nccl.VERSION_CODE
    assert c.blocking == undef
    assert c.cgaClusterSize == undef
    assert c.minCTAs == undef
    assert c.maxCTAs == undef
    assert c.splitShare == undef
    assert c.CTAPolicy == undef
    assert c.shrinkShare == undef
    assert c.netName is None
    assert c.commName is None
    assert c.ptr != 0
    # The C struct itself: size, magic and version lead it.
    head = (ctypes.c_size_t * 1).from_address(c.ptr)[0]
    assert head == c.nbytes
    assert ctypes.c_uint.from_address(c.ptr + ctypes.sizeof(ctypes.c_size_t)).value == c.magic


def test_config_set_fields() -> None:
    c = nccl.Config(blocking=0, minCTAs=4, maxCTAs=16, netName="Socket", commName=b"mine")
    assert c.blocking == 0
    assert c.minCTAs == 4
    assert c.maxCTAs == 16
    assert c.netName == "Socket"
    assert c.commName == "mine"
    c.blocking = 1
    assert c.blocking == 1
    c.netName = None
    assert c.netName is None
    c.commName = "other"
    assert c.commName == "other"
    assert c.size == c.nbytes  # read-only header unchanged


def test_config_string_field_outlives_caller_value() -> None:
    c = nccl.Config()
    c.commName = "".join(["co", "mm", "-", str(12345)])  # a temporary str
    for _ in range(1000):
        _ = bytes(1000)  # churn the allocator
    assert c.commName == "comm-12345"


def test_config_unknown_field() -> None:
    with pytest.raises(TypeError, match="nosuch"):
        nccl.Config(nosuch=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        nccl.CollConfig(blocking=1)  # type: ignore[call-arg]


def test_config_bad_values() -> None:
    c = nccl.Config()
    with pytest.raises(TypeError):
        c.blocking = "yes"  # type: ignore[assignment]
    with pytest.raises(OverflowError):
        c.blocking = 2**40
    with pytest.raises(TypeError):
        c.netName = 5  # type: ignore[assignment]


def test_other_struct_defaults() -> None:
    cc = nccl.CollConfig()
    assert cc.forceAlgSelection == 1
    assert cc.size == cc.nbytes
    assert cc.algSelection is None
    assert cc.ext == 0
    sim = nccl.SimInfo()
    assert sim.estimatedTime == -1.0
    assert sim.estimatedTime == nccl.UNDEF_FLOAT
    assert sim.size == sim.nbytes
    enc = nccl.EncryptionConfig()
    assert enc.size == enc.nbytes
    assert enc.psk is None
    enc.psk = "secret"
    assert enc.psk == "secret"


# --- bad arguments: Python exceptions, never a crash ---------------------------------------


@pytest.mark.parametrize(
    ("call", "exc"),
    [
        (lambda: nccl.comm_count("x"), TypeError),
        (lambda: nccl.comm_count(2**64), OverflowError),
        (lambda: nccl.comm_init_all(-1), UsageError),
        (lambda: nccl.comm_init_all(1, [0, 1]), UsageError),
        (lambda: nccl.comm_shrink(0, [object()], None, 0), TypeError),
        (lambda: nccl.comm_shrink(0, [2**40], None, 0), OverflowError),
        (lambda: nccl.comm_split(0, 0, 0, object()), TypeError),
        (lambda: nccl.param_get(0, -1), UsageError),
        (lambda: nccl.param_bind(None), TypeError),
        (lambda: nccl.param_get_parameter(5), TypeError),
        (lambda: nccl.get_error_string("a"), TypeError),
        (lambda: nccl.get_error_string(2**40), OverflowError),
        (lambda: nccl.mem_alloc(-1), OverflowError),
        (lambda: nccl.all_reduce(0, 0, -1, 7, 0, 0, 0), OverflowError),
        (lambda: nccl.comm_init_rank(1, None, 0), TypeError),
        (lambda: nccl.comm_init_rank_scalable(1, 0, [b"short"]), UsageError),
        (lambda: nccl.set_encryption(None), TypeError),
        (lambda: nccl.wait_signal([object()], 0, 0), TypeError),
    ],
    ids=lambda v: "" if isinstance(v, type) else None,
)
def test_bad_arguments(call: object, exc: type[BaseException]) -> None:
    assert callable(call)
    with pytest.raises(exc):
        call()


def test_usage_error_is_value_error() -> None:
    with pytest.raises(ValueError):
        nccl.comm_init_all(-1)


# --- NULL handles --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("function", "c_name"),
    [
        (nccl.comm_count, "ncclCommCount"),
        (nccl.comm_cu_device, "ncclCommCuDevice"),
        (nccl.comm_user_rank, "ncclCommUserRank"),
        (nccl.comm_get_async_error, "ncclCommGetAsyncError"),
    ],
)
def test_null_comm_is_invalid_argument(function: object, c_name: str) -> None:
    assert callable(function)
    with pytest.raises(NCCLInvalidArgumentError) as info:
        function(0)
    err = info.value
    assert err.status == nccl.Result.INVALID_ARGUMENT
    assert err.function == c_name
    assert err.status_name == "ncclInvalidArgument"
    assert "ncclInvalidArgument" in str(err)
    assert "(4)" in str(err)
    assert c_name in str(err)
    description = nccl.get_error_string(4)
    assert description is not None and description in str(err)


def test_last_error_after_null_comm() -> None:
    with pytest.raises(NCCLInvalidArgumentError) as info:
        nccl.comm_count(0)
    last = nccl.get_last_error()
    assert isinstance(last, str)
    assert last
    assert info.value.last_error == last
    assert nccl.get_last_error(None) == last


# --- param API (NCCL 2.30+) ----------------------------------------------------------------


def _needs_param_api() -> None:
    if nccl.get_version() < 23003:
        pytest.skip("the param API needs NCCL 2.30.3")


def test_param_keys() -> None:
    _needs_param_api()
    keys = nccl.param_get_all_parameter_keys()
    assert isinstance(keys, list)
    assert keys
    assert all(isinstance(k, str) and k.startswith("NCCL_") for k in keys)
    assert len(set(keys)) == len(keys)


def test_param_get_parameter_returns_str_for_every_key() -> None:
    _needs_param_api()
    for key in nccl.param_get_all_parameter_keys():
        value = nccl.param_get_parameter(key)
        assert isinstance(value, str), key


def test_param_bind_and_get_str() -> None:
    _needs_param_api()
    keys = nccl.param_get_all_parameter_keys()
    found = []
    for key in keys:
        handle = nccl.param_bind(key)
        assert isinstance(handle, int)
        assert handle != 0
        try:
            value = nccl.param_get_str(handle)
        except NCCLInvalidArgumentError:
            continue  # not a string parameter
        assert isinstance(value, str)
        assert value == nccl.param_get_parameter(key)
        raw = nccl.param_get(handle, 1024)
        assert raw == value.encode() + b"\x00"
        found.append(key)
    assert found, f"no string parameter among {keys}"


def test_param_get_max_len_too_small() -> None:
    _needs_param_api()
    for key in nccl.param_get_all_parameter_keys():
        handle = nccl.param_bind(key)
        try:
            value = nccl.param_get_str(handle)
        except NCCLInvalidArgumentError:
            continue
        if value:
            with pytest.raises(NCCLError):
                nccl.param_get(handle, len(value))
            return
    pytest.skip("no non-empty string parameter")


def test_param_typed_getter_mismatch() -> None:
    _needs_param_api()
    handle = nccl.param_bind(nccl.param_get_all_parameter_keys()[0])
    # No parameter is every width at once: at least one typed getter refuses.
    refused = 0
    for getter in (nccl.param_get_i8, nccl.param_get_u16, nccl.param_get_i32, nccl.param_get_u64):
        try:
            assert isinstance(getter(handle), int)
        except NCCLInvalidArgumentError as err:
            assert err.function.startswith("ncclParamGet")
            refused += 1
    assert refused >= 1


def test_param_unknown_key() -> None:
    _needs_param_api()
    with pytest.raises(NCCLInvalidArgumentError) as info:
        nccl.param_bind("NCCL_NO_SUCH_PARAMETER_FOR_TESTS")
    assert info.value.function == "ncclParamBind"
    with pytest.raises(NCCLInvalidArgumentError):
        nccl.param_get_parameter("NCCL_NO_SUCH_PARAMETER_FOR_TESTS")
