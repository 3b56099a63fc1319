# Support code of mpbind.bindings.cufftmp, written by hand; the generated cufftmp.pyx
# includes it. codegen/specs/cufftmp.toml [inline.*] names the static inline functions
# defined here (and the signatures their stubs show).
#
# cufftMp.h's inline helpers, reproduced over the exported entry points they call.

# The sizes and the type are converted to their C types before the communicator is attached (the
# first library call), so that a bad one is refused before anything changed.

def mp_make_plan2d(plan, nx, ny, type, comm_handle, comm_type):
    """cufftMpMakePlan2d: static inline in the header; attaches the communicator, then makes the 2-D plan; returns the work size."""
    cdef int _nx = _int_arg(nx, "nx"), _ny = _int_arg(ny, "ny"), _type = _int_arg(type, "type")
    mp_attach_comm(plan, comm_type, comm_handle)
    return make_plan2d(plan, _nx, _ny, _type)


def mp_make_plan3d(plan, nx, ny, nz, type, comm_handle, comm_type):
    """cufftMpMakePlan3d: static inline in the header; attaches the communicator, then makes the 3-D plan; returns the work size."""
    cdef int _nx = _int_arg(nx, "nx"), _ny = _int_arg(ny, "ny"), _nz = _int_arg(nz, "nz"), _type = _int_arg(type, "type")
    mp_attach_comm(plan, comm_type, comm_handle)
    return make_plan3d(plan, _nx, _ny, _nz, _type)


def mp_make_plan_decomposition(plan, rank, n, lower_input, upper_input, strides_input, lower_output, upper_output, strides_output, type, comm_handle, comm_type):
    """cufftMpMakePlanDecomposition: static inline in the header; sets the input/output box distribution, then makes the 2-D or 3-D plan; returns the work size."""
    if len(n) != rank:
        raise _UsageError("n has %d elements; rank is %d" % (len(n), rank))
    xt_set_distribution(plan, rank, lower_input, upper_input, lower_output, upper_output, strides_input, strides_output)
    if rank == 2:
        return mp_make_plan2d(plan, n[0], n[1], type, comm_handle, comm_type)
    if rank == 3:
        return mp_make_plan3d(plan, n[0], n[1], n[2], type, comm_handle, comm_type)
    _raise_error(CUFFT_NOT_IMPLEMENTED, "cufftMpMakePlanDecomposition")  # 1-D is not supported


def mp_make_reshape(handle, element_size, rank, lower_input, upper_input, strides_input, lower_output, upper_output, strides_output, comm_handle, comm_type):
    """cufftMpMakeReshape: static inline in the header; calls the versioned entry point __cufftMpMakeReshape_11_4, as the header does (cuFFTMp 11.4 and later export it)."""
    _mp_make_reshape_11_4(handle, element_size, rank, lower_input, upper_input, strides_input, lower_output, upper_output, strides_output, comm_handle, comm_type)
