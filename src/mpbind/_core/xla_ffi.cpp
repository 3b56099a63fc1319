// XLA FFI handlers (mpbind.jax): the collectives, the FFT, the reshape and the planned matmul of the
// core's launches
// (launch.hpp), callable from a jax.jit program. Built only where jaxlib's FFI headers were found
// (CMakeLists.txt: MPBIND_XLA_FFI); the headers are the whole interface (a versioned C API the
// handler receives from XLA at run time), so the module depends on no jaxlib at run time.
//
// Each handler decodes XLA's call frame (the stream XLA runs it on, the device, the buffers and the
// attributes naming the registered object), runs the launch and turns its Status into an XLA error.
// None synchronises the host, and none is captured into XLA's command buffers (below).

#include <nanobind/nanobind.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "xla/ffi/api/ffi.h"

#include "launch.hpp"
#include "register.hpp"

namespace mpbind::xla_handlers {

namespace {

namespace ffi = xla::ffi;

ffi::Error to_error(const launch::Status& st) {
    switch (st.code) {
        case launch::Status::kOk: return ffi::Error::Success();
        case launch::Status::kInvalid: return ffi::Error(ffi::ErrorCode::kInvalidArgument, st.message);
        case launch::Status::kAborted: return ffi::Error(ffi::ErrorCode::kAborted, st.message);
        case launch::Status::kTimeout: return ffi::Error(ffi::ErrorCode::kDeadlineExceeded, st.message);
        case launch::Status::kFailed:
        case launch::Status::kInterrupted: break;  // (a handler's launch is never interruptible)
    }
    return ffi::Error(ffi::ErrorCode::kInternal, st.message);
}

// ncclDataType_t of an XLA element type; -1 when NCCL has none.
int nccl_dtype(ffi::DataType t) {
    switch (t) {
        case ffi::DataType::S8: return 0;
        case ffi::DataType::U8: return 1;
        case ffi::DataType::S32: return 2;
        case ffi::DataType::U32: return 3;
        case ffi::DataType::S64: return 4;
        case ffi::DataType::U64: return 5;
        case ffi::DataType::F16: return 6;
        case ffi::DataType::F32: return 7;
        case ffi::DataType::F64: return 8;
        case ffi::DataType::BF16: return 9;
        case ffi::DataType::F8E4M3FN: return 10;
        case ffi::DataType::F8E5M2: return 11;
        default: return -1;
    }
}

// A complex buffer is reduced as its real and imaginary parts (sum and avg only: NCCL's max of a
// complex number would be meaningless); the count doubles.
int nccl_dtype_of(ffi::DataType t, int op, bool& refused) {
    refused = false;
    if (t == ffi::DataType::C64 || t == ffi::DataType::C128) {
        if (op != 0 && op != 4) refused = true;
        return t == ffi::DataType::C64 ? 7 : 8;
    }
    return nccl_dtype(t);
}

ffi::Error collective(launch::Collective kind, void* stream, int32_t device, ffi::AnyBuffer x,
                      ffi::Result<ffi::AnyBuffer> y, uint64_t comm, int32_t op) {
    bool refused = false;
    int dtype = nccl_dtype_of(x.element_type(), op, refused);
    if (dtype < 0 || refused || x.element_type() != y->element_type()) {
        return ffi::Error::InvalidArgument("mpbind: NCCL cannot reduce or move this element type with this operation");
    }
    return to_error(launch::collective(comm, kind, reinterpret_cast<uintptr_t>(stream), device, x.untyped_data(),
                                       x.size_bytes(), y->untyped_data(), y->size_bytes(), dtype, op));
}

ffi::Error all_reduce(void* stream, int32_t device, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y, uint64_t comm,
                      int32_t op) {
    return collective(launch::Collective::kAllReduce, stream, device, x, y, comm, op);
}
ffi::Error all_gather(void* stream, int32_t device, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y, uint64_t comm) {
    return collective(launch::Collective::kAllGather, stream, device, x, y, comm, 0);
}
ffi::Error reduce_scatter(void* stream, int32_t device, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                          uint64_t comm, int32_t op) {
    return collective(launch::Collective::kReduceScatter, stream, device, x, y, comm, op);
}
ffi::Error all_to_all(void* stream, int32_t device, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y, uint64_t comm) {
    return collective(launch::Collective::kAllToAll, stream, device, x, y, comm, 0);
}

ffi::Error fft(void* stream, int32_t device, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y, uint64_t plan,
               int32_t direction) {
    return to_error(launch::fft(plan, reinterpret_cast<uintptr_t>(stream), device, x.untyped_data(), x.size_bytes(),
                                y->untyped_data(), y->size_bytes(), direction));
}

ffi::Error reshape(void* stream, int32_t device, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y, uint64_t plan) {
    return to_error(launch::reshape(plan, reinterpret_cast<uintptr_t>(stream), device, x.untyped_data(),
                                    x.size_bytes(), y->untyped_data(), y->size_bytes()));
}

// D of a planned matmul from A and B (and C where it was planned with one).
ffi::Error matmul_call(void* stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b, const ffi::AnyBuffer* c,
                       ffi::AnyBuffer& d, uint64_t plan) {
    std::array<const void*, 4> ptrs{a.untyped_data(), b.untyped_data(), c ? c->untyped_data() : nullptr,
                                    d.untyped_data()};
    std::array<size_t, 4> bytes{a.size_bytes(), b.size_bytes(), c ? c->size_bytes() : 0, d.size_bytes()};
    return to_error(launch::matmul(plan, reinterpret_cast<uintptr_t>(stream), device, ptrs, bytes));
}

ffi::Error matmul(void* stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> d,
                  uint64_t plan) {
    return matmul_call(stream, device, a, b, nullptr, *d, plan);
}

ffi::Error matmul_c(void* stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::AnyBuffer c,
                    ffi::Result<ffi::AnyBuffer> d, uint64_t plan) {
    return matmul_call(stream, device, a, b, &c, *d, plan);
}

auto bind() {
    return ffi::Ffi::Bind().Ctx<ffi::PlatformStream<void*>>().Ctx<ffi::DeviceOrdinal>().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>();
}

// A and B; C (matmul_c) and D follow.
auto matmul_bind() {
    return ffi::Ffi::Bind().Ctx<ffi::PlatformStream<void*>>().Ctx<ffi::DeviceOrdinal>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>();
}

}  // namespace

// None is declared command-buffer compatible, so XLA runs each call itself, never a replay of a graph
// it captured once: a replay would skip the launch's checks (a communicator closed or aborted since,
// a plan released), and the watchdog would not see the work. The FFT on a plan of the default stream
// could not be captured anyway: cuFFTMp refuses cufftSetStream on a stream being captured.
XLA_FFI_DEFINE_HANDLER_SYMBOL(kAllReduce, all_reduce, bind().Attr<uint64_t>("comm").Attr<int32_t>("op"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(kAllGather, all_gather, bind().Attr<uint64_t>("comm"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(kReduceScatter, reduce_scatter, bind().Attr<uint64_t>("comm").Attr<int32_t>("op"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(kAllToAll, all_to_all, bind().Attr<uint64_t>("comm"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(kFft, fft, bind().Attr<uint64_t>("plan").Attr<int32_t>("direction"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(kReshape, reshape, bind().Attr<uint64_t>("plan"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(kMatmul, matmul, matmul_bind().Ret<ffi::AnyBuffer>().Attr<uint64_t>("plan"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(kMatmulC, matmul_c,
                              matmul_bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>().Attr<uint64_t>("plan"));

}  // namespace mpbind::xla_handlers

namespace mpbind {

namespace nb = nanobind;

void register_xla(nb::module_& parent) {
    using namespace xla_handlers;
    nb::module_ m = parent.def_submodule("xla", "XLA FFI handlers of the core's launches (mpbind.jax).");
    m.attr("FFI_API_VERSION") = nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);
    m.def("handlers", [] {
        nb::dict out;
        auto add = [&](const char* name, XLA_FFI_Handler* fn) {
            out[name] = nb::capsule(reinterpret_cast<void*>(fn));
        };
        add("all_reduce", kAllReduce);
        add("all_gather", kAllGather);
        add("reduce_scatter", kReduceScatter);
        add("all_to_all", kAllToAll);
        add("fft", kFft);
        add("reshape", kReshape);
        add("matmul", kMatmul);
        add("matmul_c", kMatmulC);
        return out;
    }, "{name: PyCapsule of the XLA_FFI_Handler}, for jax.ffi.register_ffi_target(..., platform='CUDA').");
}

}  // namespace mpbind
