# Support code of mpbind.bindings.cublasmp, written by hand; the generated cublasmp.pyx
# includes it.
#
# The logger callback: _convert_logger_callback (the converter codegen/specs/cublasmp.toml
# names for logger_set_callback's `callback`) keeps the Python callable and passes cuBLASMp a
# C trampoline that calls it.

cdef object _logger_callback = None


cdef void _logger_trampoline(int level, const char* function, const char* message) noexcept with gil:
    # Called by cuBLASMp from any thread; takes the GIL, never lets an exception escape into C.
    cb = _logger_callback
    if cb is None:
        return
    try:
        cb(level, _str_or_none(function) or "", _str_or_none(message) or "")
    except BaseException as exc:
        import sys
        sys.unraisablehook(sys.UnraisableHookArgs((type(exc), exc, exc.__traceback__, "cuBLASMp logger callback", cb)))


cdef intptr_t _convert_logger_callback(object callback) except? -1:
    global _logger_callback
    if callback is None:
        _logger_callback = None
        return 0
    if not callable(callback):
        raise TypeError("callback must be a callable (level: int, function: str, message: str) or None, not %s"
                        % type(callback).__name__)
    _logger_callback = callback
    return <intptr_t>_logger_trampoline
