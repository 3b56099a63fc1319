# Support code of mpbind.bindings.nvshmem, written by hand; the generated nvshmem.pyx
# includes it. bindings/specs/nvshmem.toml [inline.*] names the static inline functions
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
    _hostlib_init(ThreadSupport.SERIALIZED, 0, None)


def init_thread(requested):
    """nvshmem_init_thread: static inline in the header; initialises asking for thread support `requested`; returns the support provided."""
    return _hostlib_init(requested, 0, None)


def finalize():
    """nvshmem_finalize: static inline in the header; finalises through nvshmemx_hostlib_finalize (collective)."""
    hostlib_finalize()


def init_attr(flags, attributes=None):
    """nvshmemx_init_attr: static inline in the header; initialises with bootstrap `flags` (InitFlags) and `attributes` (see set_attr_uniqueid_args, set_attr_mpi_comm_args)."""
    _hostlib_init(ThreadSupport.SERIALIZED, flags, attributes)
