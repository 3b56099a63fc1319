# Support code of mpbind.bindings.nvshmem, written by hand; the generated nvshmem.pyx
# includes it. codegen/specs/nvshmem.toml [inline.*] names the static inline functions
# defined here (and the signatures their stubs show).
#
# The headers' static inline init functions, reproduced over the host library's exported,
# versioned entry point nvshmemid_hostlib_init_attr. mpbind carries no device code, so it
# reports the loaded host library's own version as the "device library" version, and it
# writes the init-attribute struct's version fields for the loaded library: V2 (the pinned
# 3.8 layout) only when the library is at least 3.8.0, else V1, which every 3.x library
# accepts (NVSHMEM 3.4.5 knows only V1).

cdef tuple _PINNED_VERSION = (VENDOR_MAJOR_VERSION, VENDOR_MINOR_VERSION, VENDOR_PATCH_VERSION)


def _set_attr_versions(attr, loaded):
    v2 = tuple(loaded) >= _PINNED_VERSION
    tag = (2 << 16) if v2 else (1 << 16)
    args = attr.args
    uid_args = args.uid_args
    uid_args.version = (1 << 16) + uid_args.nbytes
    args.uid_args = uid_args
    args.version = tag + args.nbytes
    attr.args = args
    attr.version = tag + attr.nbytes


def _hostlib_init(requested, flags, attr):
    # Every argument is checked before attr is written to or the library is called.
    requested = _int_arg(requested, "requested")
    flags = _int_arg(flags, "flags")
    if attr is not None:
        attr = _as_InitAttr(attr, "attributes")
    loaded = vendor_get_version_info()
    if attr is not None:
        _set_attr_versions(attr, loaded)
    version = LibVersion(major=loaded[0], minor=loaded[1], patch=loaded[2])
    return id_hostlib_init_attr(requested, flags, attr, version, 0)


def init():
    """nvshmem_init: static inline in the header; initialises with NVSHMEM_THREAD_SERIALIZED and the default bootstrap."""
    _hostlib_init(NVSHMEM_THREAD_SERIALIZED, 0, None)


def init_thread(requested):
    """nvshmem_init_thread: static inline in the header; initialises asking for thread support `requested`; returns the support provided."""
    return _hostlib_init(requested, 0, None)


def finalize():
    """nvshmem_finalize: static inline in the header; finalises through nvshmemx_hostlib_finalize (collective)."""
    hostlib_finalize()


def init_attr(flags, attributes=None):
    """nvshmemx_init_attr: static inline in the header; initialises with bootstrap `flags` (InitFlags) and `attributes` (see set_attr_uniqueid_args, set_attr_mpi_comm_args)."""
    _hostlib_init(NVSHMEM_THREAD_SERIALIZED, flags, attributes)



# The collective launch's arguments in CUDA's conventions, for the parameter roles "kernel",
# "dim3" and "kernel_args" (codegen/roles.py), which call the cdef _launch_* functions. A kernel
# is what the CUDA runtime launches as `const void* func` (CUDA documents a CUkernel, the same type
# as cudaKernel_t, as accepted there); a dim3 defaults missing extents to 1; kernelParams holds one
# pointer per kernel parameter, to memory holding its value, read when the launch is made.

import operator as _operator

# cuda.bindings' handle types a kernel may be given as (they convert with int()).
_KERNEL_TYPES = frozenset({"CUkernel", "CUfunction", "cudaKernel_t", "cudaFunction_t"})
_KERNEL = "a kernel: a CUkernel or CUfunction (cuda.bindings), a cuda.core Kernel, or an int address"
_EXTENTS = "an int or a tuple of one to three ints (x, y, z)"
_ARGUMENTS = "a tuple or list of argument addresses, the int address of a void* array, or None"


def _launch_int(value, name, expected):
    """value as an int (an int or anything with __index__, such as a NumPy integer; not a bool)."""
    if isinstance(value, bool):
        raise TypeError("%s must be %s, not bool" % (name, expected))
    try:
        return _operator.index(value)
    except TypeError:
        raise TypeError("%s must be %s, not %s" % (name, expected, type(value).__name__)) from None


def _launch_address(value, name, expected):
    """A non-NULL address, 0 < address < 2**64."""
    address = _launch_int(value, name, expected)
    if not 0 < address < 2 ** 64:
        raise _UsageError("%s must be a non-NULL address below 2**64, got %d" % (name, address))
    return address


def _kernel_address(kernel, name="func"):
    """The address a kernel argument passes as `const void* func`."""
    if not isinstance(kernel, int) and type(kernel).__name__ not in _KERNEL_TYPES and hasattr(kernel, "handle"):
        kernel = kernel.handle  # cuda.core's Kernel: its CUkernel
    if type(kernel).__name__ in _KERNEL_TYPES:
        kernel = int(kernel)
    return _launch_address(kernel, name, _KERNEL)


def _extents(value, name="dims"):
    """(x, y, z) of a grid or block shape: n is (n, 1, 1); missing extents are 1."""
    if isinstance(value, (tuple, list)):
        if not 1 <= len(value) <= 3:
            raise _UsageError("%s takes one to three extents (x, y, z), got %d" % (name, len(value)))
        extents = list(value) + [1] * (3 - len(value))
    elif all(hasattr(value, axis) for axis in "xyz"):  # Dim3, cuda.bindings' dim3
        extents = [value.x, value.y, value.z]
    else:
        extents = [value, 1, 1]
    out = tuple(_launch_int(v, name, _EXTENTS) for v in extents)
    for axis, v in zip("xyz", out):
        if not 0 <= v < 2 ** 32:
            raise _UsageError("%s.%s must be in [0, 2**32), got %d" % (name, axis, v))
    return out


def _argument_addresses(args, name="args"):
    """The kernelParams of `args`: a list of argument addresses (to copy into a C array), the
    address of an existing array (an int), or None (NULL)."""
    if args is None:
        return None
    if isinstance(args, (tuple, list)):
        return [_launch_address(a, "%s[%d]" % (name, i), "an int address") for i, a in enumerate(args)]
    return _launch_address(args, name, _ARGUMENTS)


cdef const void* _launch_kernel(object kernel, str name) except NULL:
    return <const void*><size_t>_kernel_address(kernel, name)


cdef dim3 _launch_dim3(object value, str name) except *:
    cdef dim3 d
    d.x, d.y, d.z = _extents(value, name)
    return d


cdef object _launch_addresses(object args, str name):
    """The checked kernelParams of `args` (see _argument_addresses), for _launch_params."""
    return _argument_addresses(args, name)


cdef int _launch_params(object addresses, void*** params, void*** owned) except -1:
    """Set params to the kernelParams of `addresses` (what _launch_addresses returned); owned to the
    array it allocated (the caller frees it)."""
    cdef Py_ssize_t i
    cdef void** array
    params[0] = NULL
    owned[0] = NULL
    if addresses is None:
        return 0
    if isinstance(addresses, int):
        params[0] = <void**><size_t>addresses
        return 0
    array = <void**>PyMem_Malloc(max(len(addresses), 1) * sizeof(void*))
    if array == NULL:
        raise MemoryError()
    for i in range(len(addresses)):
        array[i] = <void*><size_t>addresses[i]
    owned[0] = array
    params[0] = array
    return 0
