// The extension module mpbind._core: the hand-written C++ core of mpbind (nanobind).
//
// It owns library resources for the Pythonic layer: communicators, symmetric
// allocations, grids, descriptors, plans and registrations. mpbind.nccl,
// mpbind.nvshmem, mpbind.cublasmp and mpbind.cufftmp re-export its objects.

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "register.hpp"

namespace {

std::string abi_tag() {
    std::string tag = "nanobind " NB_TOSTRING(NB_VERSION_MAJOR) "." NB_TOSTRING(
        NB_VERSION_MINOR) "." NB_TOSTRING(NB_VERSION_PATCH);
#if defined(NB_PLATFORM_ABI_TAG)
    tag += " (" NB_PLATFORM_ABI_TAG ")";
#endif
    return tag;
}

}  // namespace

NB_MODULE(_core, m) {
    m.doc() =
        "mpbind core (C++/nanobind): owner of library resources for the "
        "Pythonic layer. Internal module; use mpbind.nccl, mpbind.nvshmem, "
        "mpbind.cublasmp and mpbind.cufftmp.";

    m.def("abi_tag", &abi_tag,
          "Return the nanobind version and platform ABI tag this module was built with.");

    mpbind::register_shared(m);
    mpbind::register_testing(m);
    mpbind::register_watchdog(m);
    mpbind::register_arrays(m);
    mpbind::register_nccl(m);
    mpbind::register_cublasmp(m);
    mpbind::register_nvshmem(m);
    mpbind::register_cufftmp(m);
    mpbind::register_abi(m);
    mpbind::register_torch(m);
#ifdef MPBIND_XLA_FFI
    mpbind::register_xla(m);
#endif
}
