// cuFFTMp objects: Plan (cufftCreate/cufftDestroy), Descriptor (cufftXtMalloc/
// cufftXtFree) and Reshape (cufftMpCreateReshape/cufftMpDestroyReshape).
//
// Their releases are collective: cuFFTMp frees NVSHMEM memory in them, which
// every PE must do together. A plan that never had a communicator attached (a
// reshape never made) has allocated nothing symmetric, so it may be destroyed by
// the garbage collector: their lifetime rows are queued_once_collective.
//
// cuFFTMp's NVSHMEM collectives take part in the layer's collective fence (nvshmem.cpp): its execs
// queue NVSHMEM collectives on the plan's (the reshape's) stream, and its plans, descriptors and
// reshapes allocate and free symmetric memory, a host-side collective that must not overlap them.

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "mpbind/bindings/_core_abi/cuda_driver.hpp"
#include "mpbind/bindings/_core_abi/cuda_runtime.hpp"
#include "mpbind/bindings/_core_abi/cufftmp.hpp"
#include "mpbind/bindings/_core_abi/nvshmem.hpp"
#include "arrays.hpp"
#include "core.hpp"
#include "launch.hpp"
#include "nvshmem.hpp"
#include "register.hpp"

namespace mpbind::cufftmp {

namespace {

using namespace abi::cufftmp;
using capi::call;
namespace cudart = abi::cuda_runtime;  // the FFT plan's copies (Executor)

using XtDesc = cudaXtDesc;
using LibXtDesc = cudaLibXtDesc;

// The plan types, in the order messages list them.
constexpr cufftType kTypes[] = {CUFFT_C2C, CUFFT_Z2Z, CUFFT_R2C, CUFFT_D2Z, CUFFT_C2R, CUFFT_Z2D};

const char* type_name(int t) {
    switch (t) {
        case CUFFT_C2C: return "C2C";
        case CUFFT_Z2Z: return "Z2Z";
        case CUFFT_R2C: return "R2C";
        case CUFFT_D2Z: return "D2Z";
        case CUFFT_C2R: return "C2R";
        case CUFFT_Z2D: return "Z2D";
        default: return "?";
    }
}

void check_type(int t) {
    std::string known;
    for (cufftType k : kTypes) {
        if (t == static_cast<int>(k)) return;
        known += std::string(known.empty() ? "" : ", ") + type_name(k) + "=" + std::to_string(k);
    }
    raise_usage("fft_type must be a cufftmp.Type (" + known + "), got " + std::to_string(t));
}

void check_direction(int d) {
    if (d != CUFFT_FORWARD && d != CUFFT_INVERSE) {
        raise_usage("direction must be FORWARD (" + std::to_string(CUFFT_FORWARD) + ") or INVERSE (" +
                    std::to_string(CUFFT_INVERSE) + "), got " + std::to_string(d));
    }
}

void check_extent(const char* what, long long n) {
    if (n < 1) raise_usage(std::string(what) + " must be >= 1, got " + std::to_string(n));
    if (n > 0x7fffffffLL) raise_usage(std::string(what) + " must fit in an int, got " + std::to_string(n));
}

// A communicator for cufftMpAttachComm / cufftMpMakeReshape: MPI needs the
// address of an MPI_Comm (MPI_Comm*, what mpi4py's MPI._addressof returns);
// NONE takes no communicator.
void check_comm(int comm_type, uintptr_t comm_handle) {
    if (comm_type == CUFFT_COMM_MPI) {
        if (comm_handle == 0) raise_usage("CommType.MPI needs the address of an MPI_Comm, got 0");
    } else if (comm_type == CUFFT_COMM_NONE) {
        if (comm_handle != 0) raise_usage("CommType.NONE takes no communicator (comm_handle must be 0)");
    } else {
        raise_usage("comm_type must be CommType.MPI (" + std::to_string(CUFFT_COMM_MPI) + ") or CommType.NONE (" +
                    std::to_string(CUFFT_COMM_NONE) + "), got " + std::to_string(comm_type));
    }
}

std::vector<long long> corner(const char* what, const std::vector<long long>& v, size_t rank) {
    if (v.size() != rank) {
        raise_usage(std::string(what) + " has " + std::to_string(v.size()) + " elements; rank is " +
                    std::to_string(rank));
    }
    return v;
}

void check_box(const char* lower_name, const std::vector<long long>& lower, const char* upper_name,
               const std::vector<long long>& upper) {
    for (size_t i = 0; i < lower.size(); ++i) {
        if (lower[i] < 0 || upper[i] < lower[i]) {
            raise_usage(std::string("box [") + lower_name + ", " + upper_name + ") has lower " +
                        std::to_string(lower[i]) + " and upper " + std::to_string(upper[i]) + " in dimension " +
                        std::to_string(i) + " (need 0 <= lower <= upper)");
        }
    }
}

// A state may outlive the interpreter (queued at exit): its Python references
// are then leaked rather than released without an interpreter.
void forget_if_finalized(nb::object& a, nb::object& b) {
    if (Py_IsInitialized()) return;
    a.release();
    b.release();
}

// --- plan ---

class PlanState : public State {
public:
    explicit PlanState(int handle) : State("cufftmp.Plan"), handle(handle) {}
    ~PlanState() override { forget_if_finalized(comm, stream_obj); }
    int handle;
    int comm_type = -1;     // none attached yet
    uintptr_t comm_handle = 0;
    nb::object comm;        // the Python communicator: cuFFTMp keeps the MPI_Comm* until destroy
    uintptr_t stream = 0;
    nb::object stream_obj;  // kept alive while the plan uses it
    int fft_type = 0;       // 0 until made
    std::vector<long long> shape;
    size_t work_size = 0;
    bool distributed = false;  // cufftXtSetDistribution was called

    bool made() const { return fft_type != 0; }

protected:
    void release() override {
        if (comm_type != -1) nvshmem::settle_collectives_for_release();  // cufftDestroy frees symmetric memory
        call(api().cufftDestroy, handle);
        comm = nb::object();
        stream_obj = nb::object();
    }
};

using Plan = Ref<PlanState>;

class DescState : public State {
public:
    DescState(std::shared_ptr<PlanState> plan, LibXtDesc* desc, int format)
        : State("cufftmp.Descriptor"), plan(std::move(plan)), desc(desc), format(format) {}
    std::shared_ptr<PlanState> plan;  // for cufftXtMemcpy
    LibXtDesc* desc;
    int format;

protected:
    void release() override {
        nvshmem::settle_collectives_for_release();
        call(api().cufftXtFree, desc);
    }
};

using Descriptor = Ref<DescState>;

class ReshapeState : public State {
public:
    explicit ReshapeState(void* handle) : State("cufftmp.Reshape"), handle(handle) {}
    ~ReshapeState() override { forget_if_finalized(comm, comm); }
    void* handle;
    nb::object comm;
    bool made = false;
    size_t element_size = 0;
    size_t in_elements = 0, out_elements = 0;

protected:
    void release() override {
        if (made) nvshmem::settle_collectives_for_release();
        call(api().cufftMpDestroyReshape, handle);
        comm = nb::object();
    }
};

using Reshape = Ref<ReshapeState>;

// --- plan operations ---

Plan create_plan() {
    int h = 0;
    call(api().cufftCreate, &h);
    return Plan(std::make_shared<PlanState>(h));
}

void check_not_made(PlanState& s, const char* what) {
    if (s.made()) {
        raise_usage(std::string(what) + ": the plan is already made (" + type_name(s.fft_type) +
                    "); create a new Plan");
    }
}

void attach_comm(Plan& self, int comm_type, uintptr_t comm_handle, nb::object keep) {
    PlanState& s = self.get();
    check_comm(comm_type, comm_handle);
    check_not_made(s, "attach_comm");
    if (s.comm_type != -1) raise_usage("attach_comm: a communicator is already attached to this plan");
    call(api().cufftMpAttachComm, s.handle, comm_type, reinterpret_cast<void*>(comm_handle));
    s.comm_type = comm_type;
    s.comm_handle = comm_handle;
    s.comm = std::move(keep);
    s.became_collective();  // cuFFTMp allocates symmetric memory from now on
}

void set_stream(Plan& self, nb::object stream) {
    PlanState& s = self.get();
    uintptr_t h = stream_handle(stream);
    call(api().cufftSetStream, s.handle, reinterpret_cast<void*>(h));
    s.stream = h;
    s.stream_obj = PyLong_Check(stream.ptr()) ? nb::object() : std::move(stream);
}

void check_subformat(const char* what, int f) {
    // INPUT .. DISTRIBUTED_OUTPUT are the ones a caller may ask for.
    if (f < static_cast<int>(CUFFT_XT_FORMAT_INPUT) || f > static_cast<int>(CUFFT_XT_FORMAT_DISTRIBUTED_OUTPUT)) {
        raise_usage(std::string(what) + " must be a cufftmp.SubFormat (" + std::to_string(CUFFT_XT_FORMAT_INPUT) +
                    ".." + std::to_string(CUFFT_XT_FORMAT_DISTRIBUTED_OUTPUT) + "), got " + std::to_string(f));
    }
}

void set_subformat_default(Plan& self, int forward, int inverse) {
    PlanState& s = self.get();
    check_subformat("subformat_forward", forward);
    check_subformat("subformat_inverse", inverse);
    check_not_made(s, "set_subformat_default");
    call(api().cufftXtSetSubformatDefault, s.handle, forward, inverse);
}

void set_distribution(Plan& self, const std::vector<long long>& lower_in, const std::vector<long long>& upper_in,
                      const std::vector<long long>& lower_out, const std::vector<long long>& upper_out,
                      std::optional<std::vector<long long>> strides_in,
                      std::optional<std::vector<long long>> strides_out) {
    PlanState& s = self.get();
    size_t rank = lower_in.size();
    if (rank != 2 && rank != 3) raise_usage("boxes must have 2 or 3 dimensions, got " + std::to_string(rank));
    corner("upper_input", upper_in, rank);
    corner("lower_output", lower_out, rank);
    corner("upper_output", upper_out, rank);
    if (strides_in) corner("strides_input", *strides_in, rank);
    if (strides_out) corner("strides_output", *strides_out, rank);
    check_box("lower_input", lower_in, "upper_input", upper_in);
    check_box("lower_output", lower_out, "upper_output", upper_out);
    check_not_made(s, "set_distribution");
    call(api().cufftXtSetDistribution, s.handle, static_cast<int>(rank), lower_in.data(),
         upper_in.data(), lower_out.data(), upper_out.data(), strides_in ? strides_in->data() : nullptr,
         strides_out ? strides_out->data() : nullptr);
    s.distributed = true;
}

size_t make_plan(Plan& self, const std::vector<long long>& n, int fft_type) {
    PlanState& s = self.get();
    if (n.size() != 2 && n.size() != 3) raise_usage("cuFFTMp plans are 2-D or 3-D");
    for (size_t i = 0; i < n.size(); ++i) check_extent(i == 0 ? "nx" : i == 1 ? "ny" : "nz", n[i]);
    check_type(fft_type);
    check_not_made(s, n.size() == 2 ? "make_plan_2d" : "make_plan_3d");
    size_t work = 0;
    if (s.comm_type != -1) nvshmem::settle_collectives();  // the plan allocates symmetric memory
    if (n.size() == 2) {
        call(api().cufftMakePlan2d, s.handle, static_cast<int>(n[0]), static_cast<int>(n[1]), fft_type, &work);
    } else {
        call(api().cufftMakePlan3d, s.handle, static_cast<int>(n[0]), static_cast<int>(n[1]),
             static_cast<int>(n[2]), fft_type, &work);
    }
    s.fft_type = fft_type;
    s.shape = n;
    s.work_size = work;
    return work;
}

PlanState& made_plan(Plan& self, const char* what) {
    PlanState& s = self.get();
    if (!s.made()) raise_usage(std::string(what) + ": the plan is not made yet (call make_plan_2d/3d first)");
    return s;
}

// --- exec on arrays: the hot path -----------------------------------------------------------------
//
// Plan.exec(input, output, direction) is one call: direction implied or checked, each operand an
// int pointer (taken on trust) or an array checked against the plan (dtype, writability, this PE's
// elements where the layout is known), then one cufftExec* call.

bool real_input(int t) { return t == CUFFT_R2C || t == CUFFT_D2Z; }
bool real_output(int t) { return t == CUFFT_C2R || t == CUFFT_Z2D; }

// The direction of an exec: given (checked against the plan's type) or implied by a real type.
int exec_direction(int fft_type, nb::handle given) {
    const char* t = type_name(fft_type);
    if (given.is_none()) {
        if (real_input(fft_type)) return CUFFT_FORWARD;
        if (real_output(fft_type)) return CUFFT_INVERSE;
        raise_usage(std::string("a ") + t + " plan needs direction=FORWARD or INVERSE");
    }
    long long d = 0;
    if (!arrays::as_index(given, d)) {
        raise_type("direction must be FORWARD (-1) or INVERSE (1), not " + arrays::typename_of(given));
    }
    if (d != CUFFT_FORWARD && d != CUFFT_INVERSE) {
        raise_usage("direction must be FORWARD (-1) or INVERSE (1), got " + std::to_string(d));
    }
    if (real_input(fft_type) && d != CUFFT_FORWARD) {
        raise_usage(std::string("a ") + t + " plan only transforms FORWARD");
    }
    if (real_output(fft_type) && d != CUFFT_INVERSE) {
        raise_usage(std::string("a ") + t + " plan only transforms INVERSE");
    }
    return static_cast<int>(d);
}

// (input, output) element types of the forward (or only) direction of each type.
std::pair<arrays::Dtype, arrays::Dtype> exec_dtypes(int fft_type) {
    using D = arrays::Dtype;
    switch (fft_type) {
        case CUFFT_C2C: return {D::kComplex64, D::kComplex64};
        case CUFFT_Z2Z: return {D::kComplex128, D::kComplex128};
        case CUFFT_R2C: return {D::kFloat32, D::kComplex64};
        case CUFFT_D2Z: return {D::kFloat64, D::kComplex128};
        case CUFFT_C2R: return {D::kComplex64, D::kFloat32};
        default: return {D::kComplex128, D::kFloat64};  // Z2D
    }
}

// The elements of a layout shape: extents >= 0, their product within 2**63 - 1.
long long elements(PyObject* shape) {
    if (!PyTuple_Check(shape) && !PyList_Check(shape)) {
        raise_type("layout: a shape must be a tuple of ints, not " + arrays::typename_of(shape));
    }
    nb::object seq = nb::steal(PySequence_Tuple(shape));
    if (!seq.is_valid()) throw nb::python_error();
    long long n = 1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(seq.ptr()); ++i) {
        long long e = 0;
        if (!arrays::as_index(PyTuple_GET_ITEM(seq.ptr(), i), e)) {
            raise_type("layout: a shape's extents must be ints, not " +
                       arrays::typename_of(PyTuple_GET_ITEM(seq.ptr(), i)));
        }
        if (e < 0) raise_usage("layout: negative extent " + std::to_string(e) + " in a shape");
        n = checked_mul(n, e, "layout: the elements of a shape");
    }
    return n;
}

// An operand: an int pointer (unchecked but for NULL), or an array of `dtype` with at least `need`
// elements (-1: not known here).
uintptr_t exec_operand(nb::handle obj, const char* what, arrays::Dtype dtype, long long need, bool writable) {
    if (PyBool_Check(obj.ptr())) raise_type(std::string(what) + " must be a device array or an int pointer");
    if (PyLong_Check(obj.ptr())) {
        unsigned long long p = PyLong_AsUnsignedLongLong(obj.ptr());
        if (p == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
            PyErr_Clear();
            raise_usage(std::string(what) + " must be an address in [0, 2**64), got " + arrays::repr_of(obj));
        }
        if (p == 0) raise_usage(std::string(what) + " is a NULL pointer");
        return static_cast<uintptr_t>(p);
    }
    arrays::Want want{what, writable, true, false, dtype};
    arrays::Array a = arrays::device_array(obj, want);
    if (need >= 0 && a.size < need) {
        raise_usage(std::string(what) + " has " + std::to_string(a.size) + " elements; this PE's part needs " +
                    std::to_string(need));
    }
    if (a.ptr == 0) raise_usage(std::string(what) + " is a NULL pointer");
    return a.ptr;
}

struct ExecCall {
    uintptr_t in, out;  // out 0: in place
    int direction;
};

// `layout`: {direction: (input shape, output shape)} of this PE where the facade knows it, or None.
ExecCall plan_exec(int fft_type, nb::handle input, nb::handle output, nb::handle direction, nb::handle layout) {
    int d = exec_direction(fft_type, direction);
    auto [in_dtype, out_dtype] = exec_dtypes(fft_type);
    long long need_in = -1, need_out = -1;
    if (!layout.is_none()) {
        nb::object key = nb::int_(d);
        PyObject* shapes = PyDict_GetItemWithError(layout.ptr(), key.ptr());  // borrowed
        if (shapes == nullptr && PyErr_Occurred()) throw nb::python_error();
        if (shapes != nullptr && shapes != Py_None) {
            nb::object pair = nb::steal(PySequence_Tuple(shapes));
            if (!pair.is_valid() || PyTuple_GET_SIZE(pair.ptr()) != 2) {
                PyErr_Clear();
                raise_type("layout must map a direction to (input shape, output shape)");
            }
            long long n_in = elements(PyTuple_GET_ITEM(pair.ptr(), 0));
            long long n_out = elements(PyTuple_GET_ITEM(pair.ptr(), 1));
            if (output.is_none()) {  // one buffer holds the input, then the output
                long long in_size = arrays::info(in_dtype).itemsize, out_size = arrays::info(out_dtype).itemsize;
                long long out_bytes = checked_mul(n_out, out_size, "layout: the output's bytes");
                need_in = std::max(n_in, out_bytes / in_size + (out_bytes % in_size != 0));
            } else if (fft_type == CUFFT_C2C || fft_type == CUFFT_Z2Z) {
                need_in = n_in;
                need_out = n_out;
            }
        }
    }
    ExecCall c{0, 0, d};
    c.in = exec_operand(input, "input", in_dtype, need_in, output.is_none());
    if (!output.is_none()) c.out = exec_operand(output, "output", out_dtype, need_out, true);
    return c;
}

void exec_on(PlanState& s, uintptr_t in, uintptr_t out, int direction) {
    check_direction(direction);
    if (in == 0) raise_usage("exec: the input pointer is NULL");
    if (out == 0) out = in;  // in place
    void* i = reinterpret_cast<void*>(in);
    void* o = reinterpret_cast<void*>(out);
    const Api& a = api();
    auto implied = [&](int want) {
        if (direction != want) {
            raise_usage(std::string("exec: a ") + type_name(s.fft_type) + " plan only transforms " +
                        (want == CUFFT_FORWARD ? "FORWARD (" : "INVERSE (") + std::to_string(want) +
                        "), got direction " + std::to_string(direction));
        }
    };
    nvshmem::CollectiveCall collective(s.comm_type != -1 ? "cufftmp.exec" : nullptr, s.stream);
    switch (s.fft_type) {
        case CUFFT_C2C: call(a.cufftExecC2C, s.handle, i, o, direction); break;
        case CUFFT_Z2Z: call(a.cufftExecZ2Z, s.handle, i, o, direction); break;
        case CUFFT_R2C: implied(CUFFT_FORWARD); call(a.cufftExecR2C, s.handle, static_cast<float*>(i), o); break;
        case CUFFT_D2Z: implied(CUFFT_FORWARD); call(a.cufftExecD2Z, s.handle, static_cast<double*>(i), o); break;
        case CUFFT_C2R: implied(CUFFT_INVERSE); call(a.cufftExecC2R, s.handle, i, static_cast<float*>(o)); break;
        case CUFFT_Z2D: implied(CUFFT_INVERSE); call(a.cufftExecZ2D, s.handle, i, static_cast<double*>(o)); break;
        default: raise_usage("exec: unknown plan type");
    }
    collective.queued();
}

void exec(Plan& self, uintptr_t in, uintptr_t out, int direction) {
    exec_on(made_plan(self, "exec"), in, out, direction);
}

Descriptor xt_malloc(Plan& self, int format) {
    std::shared_ptr<PlanState> plan = self.state();
    PlanState& s = made_plan(self, "malloc");
    check_subformat("format", format);
    LibXtDesc* d = nullptr;
    nvshmem::settle_collectives();  // symmetric memory when the plan is distributed
    call(api().cufftXtMalloc, s.handle, &d, format);
    if (d == nullptr) {
        raise_library_error(library.name, api().cufftXtMalloc.name, CUFFT_INTERNAL_ERROR,
                            "returned CUFFT_SUCCESS but a NULL descriptor");
    }
    auto ds = std::make_shared<DescState>(plan, d, format);
    ds->depends_on(plan);
    s.add_child(ds);
    return Descriptor(ds);
}

void exec_descriptor(Plan& self, Descriptor& input, Descriptor* output, int direction) {
    PlanState& s = made_plan(self, "exec_descriptor");
    check_direction(direction);
    DescState& in = input.get();
    DescState& out = output != nullptr ? output->get() : in;
    nvshmem::CollectiveCall collective(s.comm_type != -1 ? "cufftmp.exec_descriptor" : nullptr, s.stream);
    call(api().cufftXtExecDescriptor, s.handle, in.desc, out.desc, direction);
    collective.queued();
}

// --- descriptor operations ---

const XtDesc& local(DescState& d) {
    if (d.desc->descriptor == nullptr) {
        raise_library_error(library.name, api().cufftXtMalloc.name, CUFFT_INTERNAL_ERROR,
                            "the descriptor has no cudaXtDesc");
    }
    return *d.desc->descriptor;
}

void memcpy_host(Descriptor& self, uintptr_t host, int copy_type) {
    DescState& d = self.get();
    if (host == 0) raise_usage("memcpy: the host pointer is NULL");
    d.plan->check_open();
    if (copy_type == CUFFT_COPY_HOST_TO_DEVICE) {
        call(api().cufftXtMemcpy, d.plan->handle, static_cast<void*>(d.desc), reinterpret_cast<void*>(host),
             copy_type);
    } else if (copy_type == CUFFT_COPY_DEVICE_TO_HOST) {
        call(api().cufftXtMemcpy, d.plan->handle, reinterpret_cast<void*>(host), static_cast<void*>(d.desc),
             copy_type);
    } else {
        raise_usage("copy_type must be CopyType.HOST_TO_DEVICE (" + std::to_string(CUFFT_COPY_HOST_TO_DEVICE) +
                    ") or DEVICE_TO_HOST (" + std::to_string(CUFFT_COPY_DEVICE_TO_HOST) + ") here, got " +
                    std::to_string(copy_type) + " (use copy_from for DEVICE_TO_DEVICE)");
    }
}

void copy_from(Descriptor& self, Descriptor& src) {
    DescState& d = self.get();
    DescState& s = src.get();
    if (&d == &s) raise_usage("copy_from: source and destination are the same descriptor");
    d.plan->check_open();
    call(api().cufftXtMemcpy, d.plan->handle, static_cast<void*>(d.desc), static_cast<void*>(s.desc),
         CUFFT_COPY_DEVICE_TO_DEVICE);
}

// --- the FFT plan's execute (mpbind.fft): one call -----------------------------------------------------
//
// mpbind.fft.FFTPlan.execute(x, direction=, out=) is one call into the Executor its plan made once:
// x and out are taken in (the one intake, arrays.cpp) and checked against this rank's pieces (dtype,
// device, shape, contiguity) before anything runs; x is copied into the plan's buffer unless it can
// be transformed where it is; the transform runs (cufftExec* on the pointer for cuFFTMp's slabs,
// cufftXtExecDescriptor on the plan's descriptor pointed at it for boxes); the result is copied into
// out when given. Copies and the transform are queued on the plan's stream, in that order.

// One rank's piece on one side of a transform, as the plan stores it.
struct Side {
    arrays::Dtype dtype = arrays::Dtype::kInvalid;
    std::vector<int64_t> shape, storage;
    std::vector<int64_t> strides;  // row-major of storage, in elements (the stored layout)
    std::vector<int64_t> packed;   // row-major of shape (a packed array, which the copy pads)
    std::string box;               // the box's repr, for messages
    int64_t itemsize = 0;
    int64_t rows = 1;       // elements of every axis but the last
    int64_t row_bytes = 0;  // the last axis's bytes
    int64_t pitch = 0;      // a stored row's bytes (padding included)

    bool padded() const { return storage != shape; }
};

// Row-major strides in elements (an empty extent counts as 1, as cuFFTMp takes them).
std::vector<int64_t> row_major(const std::vector<int64_t>& shape) {
    std::vector<int64_t> out(shape.size());
    int64_t step = 1;
    for (size_t i = shape.size(); i-- > 0;) {
        out[i] = step;
        step = checked_mul<int64_t>(step, std::max<int64_t>(shape[i], 1), "a piece's elements");
    }
    return out;
}

// A side from (dtype name, shape, storage, box repr), as mpbind.fft describes it.
Side make_side(nb::handle described) {
    if (!nb::isinstance<nb::tuple>(described) || nb::len(described) != 4) {
        raise_type("a side must be (dtype, shape, storage, box text), not " + arrays::repr_of(described));
    }
    nb::tuple t = nb::borrow<nb::tuple>(described);
    Side s;
    s.dtype = arrays::dtype_of(t[0]);
    s.shape = nb::cast<std::vector<int64_t>>(t[1]);
    s.storage = nb::cast<std::vector<int64_t>>(t[2]);
    s.box = nb::cast<std::string>(t[3]);
    if (s.shape.empty() || s.shape.size() != s.storage.size()) {
        raise_usage("a side's shape and storage must have the same number (>= 1) of extents");
    }
    for (size_t i = 0; i < s.shape.size(); ++i) {
        if (s.shape[i] < 0 || s.storage[i] < s.shape[i]) raise_usage("a side's storage must hold its shape");
    }
    s.strides = row_major(s.storage);
    s.packed = row_major(s.shape);
    s.itemsize = arrays::info(s.dtype).itemsize;
    for (size_t i = 0; i + 1 < s.shape.size(); ++i) s.rows = checked_mul(s.rows, s.shape[i], "a piece's rows");
    s.row_bytes = checked_mul(s.shape.back(), s.itemsize, "a piece's row");
    s.pitch = checked_mul(s.storage.back(), s.itemsize, "a piece's stored row");
    checked_mul(s.rows, s.pitch, "a piece's bytes");
    return s;
}

// Python's repr of a tuple of ints: "(4, 6, 5)", "(5,)".
template <class V>
std::string tuple_text(const V& v) {
    std::string r = "(";
    for (size_t i = 0; i < v.size(); ++i) r += (i ? ", " : "") + std::to_string(v[i]);
    return r + (v.size() == 1 ? ",)" : ")");
}

bool same_dims(const arrays::Dims& a, const std::vector<int64_t>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
        if (a[i] != b[i]) return false;
    }
    return true;
}

// Strides equal where they matter (extents of 1 ignore theirs; an empty array is any layout).
bool same_layout(const arrays::Dims& shape, const arrays::Dims& strides, const std::vector<int64_t>& want) {
    for (size_t i = 0; i < shape.size(); ++i) {
        if (shape[i] == 0) return true;
    }
    for (size_t i = 0; i < shape.size(); ++i) {
        if (shape[i] != 1 && strides[i] != want[i]) return false;
    }
    return true;
}

// An array given to execute, checked against one side: where it is, how to copy it, and whether it is
// transformed where it is (no copy).
struct Operand {
    uintptr_t ptr = 0;
    bool in_place = false;
    int64_t rows = 0, row_bytes = 0, pitch = 0;
};

class Executor {
public:
    std::shared_ptr<PlanState> plan;  // null: a test double, which records its calls instead of making them
    std::shared_ptr<DescState> desc;
    std::array<std::optional<std::pair<Side, Side>>, 2> sides;  // (input, output) of FORWARD, of INVERSE
    int64_t need = 0;      // bytes an array used in place needs from its start (alike on every rank)
    bool via_descriptor = false;
    int device = 0;
    std::string name;      // the feature's plan, in messages
    uintptr_t buffer = 0;  // the plan's own buffer (the descriptor's data)
    std::vector<std::pair<uintptr_t, size_t>> heap;  // a test double's symmetric ranges
    nb::list recorded;     // a test double's calls: ("copy", dst, dst_pitch, src, src_pitch, row, rows, stream), ("exec", ptr, direction)

    static size_t slot(int d) { return d == CUFFT_FORWARD ? 0 : 1; }

    const std::pair<Side, Side>& sides_of(int d) const {
        if ((d != CUFFT_FORWARD && d != CUFFT_INVERSE) || !sides[slot(d)]) {
            raise_usage(name + " does not transform in direction " + std::to_string(d));
        }
        return *sides[slot(d)];
    }

    void check_open() const {
        if (plan && (plan->closed() || desc->closed())) raise_usage(name + " is closed");
    }

    uintptr_t stream() const { return plan ? plan->stream : 0; }

    bool symmetric(uintptr_t p, size_t n) const {
        if (plan) return nvshmem::holds(p, n);
        for (const auto& [base, size] : heap) {
            if (span_within(p, n == 0 ? 1 : n, base, size)) return true;
        }
        return false;
    }

    // `obj` checked against `side`; `room` (>= 0: what a view of ours says, -1: not known) bytes of
    // symmetric memory from its start; used in place when it holds `need` bytes there (lookup: may be).
    Operand operand(nb::handle obj, const char* what, const Side& side, long long room, bool lookup,
                    bool writable) const {
        arrays::Want want{what, writable, /*contiguous=*/false, /*tuples=*/false, arrays::Dtype::kInvalid};
        arrays::Array a = arrays::device_array(obj, want);
        std::string w = what;
        if (a.dtype != side.dtype) {
            std::string have = arrays::name(a.dtype), mine = arrays::name(side.dtype);
            std::string hint;
            if (mine.rfind("float", 0) == 0 && have.rfind("complex", 0) == 0) {
                hint = " (an R2C plan takes the real array; a complex input needs a C2C plan)";
            }
            raise_usage(w + " is " + have + "; this plan's " + (w == "out" ? "output" : "input") + " on this rank is " +
                        mine + hint);
        }
        if (a.device != device) {
            raise_usage(w + " is on device " + std::to_string(a.device) + "; the plan runs on device " +
                        std::to_string(device));
        }
        bool stored;
        if (same_dims(a.shape, side.shape) && same_layout(a.shape, a.strides, side.strides)) {
            stored = true;  // laid out as the plan stores it (a padded real side included)
        } else if (same_dims(a.shape, side.storage) && same_layout(a.shape, a.strides, side.strides)) {
            stored = true;  // the padded storage itself
        } else if (same_dims(a.shape, side.shape) && same_layout(a.shape, a.strides, side.packed)) {
            stored = false;  // packed: the copy pads it
        } else if (!same_dims(a.shape, side.shape) && !same_dims(a.shape, side.storage)) {
            std::string extra = side.padded() ? " (or " + tuple_text(side.storage) + " padded)" : "";
            raise_usage(w + " has shape " + tuple_text(a.shape) + "; this rank's piece is " + tuple_text(side.shape) +
                        extra + ", box " + side.box);
        } else {
            raise_usage(w + " must be C-contiguous (strides " + tuple_text(a.strides) + " elements for shape " +
                        tuple_text(a.shape) + "); copy it with .contiguous() / cupy.ascontiguousarray first");
        }
        Operand op{a.ptr, false, side.rows, side.row_bytes, stored ? side.pitch : side.row_bytes};
        if (stored && !a.readonly && lookup) {  // a read-only input is copied, never transformed where it is
            if (room < 0) room = symmetric(a.ptr, static_cast<size_t>(need)) ? need : 0;
            op.in_place = room >= need;
        }
        return op;
    }

    void copy(uintptr_t dst, int64_t dst_pitch, uintptr_t src, int64_t src_pitch, int64_t row_bytes, int64_t rows) {
        if (rows == 0 || row_bytes == 0) return;
        uintptr_t st = stream();
        if (!plan) {
            recorded.append(nb::make_tuple("copy", dst, dst_pitch, src, src_pitch, row_bytes, rows, st));
            return;
        }
        const cudart::Api& a = cudart::api();
        auto* d = reinterpret_cast<void*>(dst);
        auto* s = reinterpret_cast<const void*>(src);
        auto* q = reinterpret_cast<cudart::cudaStream_t>(st);
        if (src_pitch == row_bytes && dst_pitch == row_bytes) {
            call(a.cudaMemcpyAsync, d, s, static_cast<size_t>(rows * row_bytes), cudart::cudaMemcpyDeviceToDevice, q);
        } else {
            call(a.cudaMemcpy2DAsync, d, static_cast<size_t>(dst_pitch), s, static_cast<size_t>(src_pitch),
                 static_cast<size_t>(row_bytes), static_cast<size_t>(rows), cudart::cudaMemcpyDeviceToDevice, q);
        }
    }

    // The transform of what `ptr` holds, in place.
    void run(uintptr_t ptr, int d) {
        check_open();
        sides_of(d);
        if (!plan) {
            recorded.append(nb::make_tuple("exec", ptr, d));
            return;
        }
        PlanState& s = *plan;
        if (!via_descriptor) {
            exec_on(s, ptr, 0, d);
            return;
        }
        // The plan's descriptor pointed at `ptr` in the layout it holds (DISTRIBUTED_INPUT before a forward
        // transform, DISTRIBUTED_OUTPUT before an inverse one), its own pointer put back after the call:
        // cufftXtFree frees what the descriptor points at.
        LibXtDesc* lib = desc->desc;
        XtDesc* xt = lib->descriptor;
        struct Restore {
            XtDesc* xt;
            void* own;
            ~Restore() { xt->data[0] = own; }
        } restore{xt, reinterpret_cast<void*>(buffer)};
        xt->data[0] = reinterpret_cast<void*>(ptr);
        lib->subFormat = d == CUFFT_FORWARD ? CUFFT_XT_FORMAT_DISTRIBUTED_INPUT : CUFFT_XT_FORMAT_DISTRIBUTED_OUTPUT;
        nvshmem::CollectiveCall collective(s.comm_type != -1 ? "cufftmp.exec_descriptor" : nullptr, s.stream);
        call(api().cufftXtExecDescriptor, s.handle, lib, lib, d);
        collective.queued();
    }

    // execute(): (the pointer transformed, whether it is x's own memory or the plan's buffer for x None).
    std::pair<uintptr_t, bool> execute(nb::handle x, long long room, nb::handle out, int d) {
        const auto& [src, dst] = sides_of(d);
        std::optional<Operand> target;
        if (!out.is_none()) target = operand(out, "out", dst, -1, false, true);
        uintptr_t ptr = buffer;
        bool in_place = true;
        if (!x.is_none()) {
            Operand op = operand(x, "x", src, room, true, false);
            in_place = op.in_place;
            if (in_place) {
                ptr = op.ptr;
            } else {
                check_open();
                copy(buffer, src.pitch, op.ptr, op.pitch, op.row_bytes, op.rows);
            }
        }
        run(ptr, d);
        if (target) copy(target->ptr, target->pitch, ptr, dst.pitch, target->row_bytes, target->rows);
        return {ptr, in_place};
    }
};

// An Executor's sides from {direction: (input side, output side)}.
void set_sides(Executor& e, nb::handle sides) {
    if (!nb::isinstance<nb::dict>(sides)) raise_type("sides must be a dict {direction: (input, output)}");
    for (auto [key, value] : nb::borrow<nb::dict>(sides)) {
        int d = nb::cast<int>(key);
        check_direction(d);
        if (!nb::isinstance<nb::tuple>(value) || nb::len(value) != 2) {
            raise_type("sides must map a direction to (input side, output side)");
        }
        nb::tuple pair = nb::borrow<nb::tuple>(value);
        e.sides[Executor::slot(d)] = std::make_pair(make_side(pair[0]), make_side(pair[1]));
    }
}

Executor make_executor(Plan& self, Descriptor& descriptor, nb::handle sides, long long need, bool via_descriptor,
                       int device, std::string name) {
    made_plan(self, "executor");
    DescState& ds = descriptor.get();
    if (ds.plan != self.state()) raise_usage("executor: the descriptor is another plan's");
    if (need < 0) raise_usage("executor: need must be >= 0, got " + std::to_string(need));
    Executor e;
    e.plan = self.state();
    e.desc = descriptor.state();
    set_sides(e, sides);
    e.need = need;
    e.via_descriptor = via_descriptor;
    e.device = device;
    e.name = std::move(name);
    e.buffer = reinterpret_cast<uintptr_t>(local(ds).data[0]);
    return e;
}


// --- launches from a framework's program (launch.hpp): no GIL, every failure a Status ---------------------
//
// A registered FFT plan keeps its Executor (sides, buffer, plan and descriptor). A plan with a stream of
// its own runs a launch there, after the framework's stream (an event recorded there, waited for on the
// plan's) and before it again (the reverse): no library call on the host but the work itself. A plan on
// the legacy default stream (stream 0) is pointed at the framework's stream for the call instead
// (cufftSetStream) and back after: the legacy stream may not wait for a stream being captured, and
// cuFFTMp refuses to be pointed at one, so these launches are never captured (xla_ffi.cpp).
// A registered reshape takes the framework's stream as it is.

struct FftLaunch {
    Executor exec;
    void* before = nullptr;  // CUevent (plans with a stream of their own): recorded on the framework's stream
    void* after = nullptr;   // CUevent: recorded on the plan's stream, waited for on the framework's
    ~FftLaunch() {
        const auto& d = abi::cuda_driver::api();  // dropped under the GIL (Registry): the table is loaded
        if (before) d.cuEventDestroy.ptr(before);
        if (after) d.cuEventDestroy.ptr(after);
    }
};

struct ReshapeLaunch {
    std::shared_ptr<ReshapeState> reshape;
    std::vector<std::shared_ptr<State>> buffers;  // the plan's symmetric arrays (released before the reshape)
    uintptr_t in_buf = 0, out_buf = 0, work = 0;
    size_t in_bytes = 0, out_bytes = 0;  // this rank's pieces, packed
    int device = 0;
};

std::string status_text(const char* function, long long status) {
    return std::string(function) + " failed with status " + std::to_string(status);
}

// cudaMemcpy2DAsync device to device of `rows` rows of `row` bytes; an error text, empty on success.
std::string copy_rows(uintptr_t dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t row, int64_t rows,
                      void* stream) {
    if (rows == 0 || row == 0) return "";
    auto st = cudart::api().cudaMemcpy2DAsync.ptr(reinterpret_cast<void*>(dst), static_cast<size_t>(dst_pitch), src,
                                                  static_cast<size_t>(src_pitch), static_cast<size_t>(row),
                                                  static_cast<size_t>(rows), cudart::cudaMemcpyDeviceToDevice, stream);
    return st == cudart::success ? "" : status_text("cudaMemcpy2DAsync", st);
}

// The transform of the plan's buffer, in place, through the raw entry points.
std::string transform(const Executor& e, int d) {
    PlanState& s = *e.plan;
    const Api& a = api();
    auto* p = reinterpret_cast<void*>(e.buffer);
    long long st = CUFFT_SUCCESS;
    const char* fn = "";
    if (e.via_descriptor) {
        LibXtDesc* lib = e.desc->desc;
        lib->descriptor->data[0] = p;  // its own buffer (a launch never points it elsewhere)
        lib->subFormat = d == CUFFT_FORWARD ? CUFFT_XT_FORMAT_DISTRIBUTED_INPUT : CUFFT_XT_FORMAT_DISTRIBUTED_OUTPUT;
        fn = "cufftXtExecDescriptor";
        st = a.cufftXtExecDescriptor.ptr(s.handle, lib, lib, d);
    } else {
        switch (s.fft_type) {
            case CUFFT_C2C: fn = "cufftExecC2C"; st = a.cufftExecC2C.ptr(s.handle, p, p, d); break;
            case CUFFT_Z2Z: fn = "cufftExecZ2Z"; st = a.cufftExecZ2Z.ptr(s.handle, p, p, d); break;
            case CUFFT_R2C: fn = "cufftExecR2C"; st = a.cufftExecR2C.ptr(s.handle, static_cast<float*>(p), p); break;
            case CUFFT_D2Z: fn = "cufftExecD2Z"; st = a.cufftExecD2Z.ptr(s.handle, static_cast<double*>(p), p); break;
            case CUFFT_C2R: fn = "cufftExecC2R"; st = a.cufftExecC2R.ptr(s.handle, p, static_cast<float*>(p)); break;
            case CUFFT_Z2D: fn = "cufftExecZ2D"; st = a.cufftExecZ2D.ptr(s.handle, p, static_cast<double*>(p)); break;
            default: return "the plan's type is unknown";
        }
    }
    return st == CUFFT_SUCCESS ? "" : status_text(fn, st);
}

// The copy in, the transform and the copy out, queued on `on`.
std::string queue_fft(const Executor& e, const void* in, void* out, int d, void* on) {
    const auto& [src, dst] = *e.sides[Executor::slot(d)];
    std::string err = copy_rows(e.buffer, src.pitch, in, src.row_bytes, src.row_bytes, src.rows, on);
    if (err.empty()) err = transform(e, d);
    if (err.empty()) {
        err = copy_rows(reinterpret_cast<uintptr_t>(out), dst.row_bytes, reinterpret_cast<const void*>(e.buffer),
                        dst.pitch, dst.row_bytes, dst.rows, on);
    }
    return err;
}

std::string launch_fft(FftLaunch& f, uintptr_t stream, const void* in, void* out, int d) {
    const Executor& e = f.exec;
    PlanState& s = *e.plan;
    auto* theirs = reinterpret_cast<void*>(stream);
    auto* ours = reinterpret_cast<void*>(s.stream);
    if (f.before != nullptr) {
        const auto& drv = abi::cuda_driver::api();
        if (auto st = drv.cuEventRecord.ptr(f.before, theirs); st != 0) return status_text("cuEventRecord", st);
        if (auto st = drv.cuStreamWaitEvent.ptr(ours, f.before, 0); st != 0) return status_text("cuStreamWaitEvent", st);
        std::string err = queue_fft(e, in, out, d, ours);
        // Joined back even after a failure: the framework's stream must not run ahead of what was queued.
        if (auto st = drv.cuEventRecord.ptr(f.after, ours); st != 0 && err.empty()) err = status_text("cuEventRecord", st);
        if (auto st = drv.cuStreamWaitEvent.ptr(theirs, f.after, 0); st != 0 && err.empty()) {
            err = status_text("cuStreamWaitEvent", st);
        }
        return err;
    }
    auto set_stream = api().cufftSetStream.ptr;
    if (auto st = set_stream(s.handle, theirs); st != CUFFT_SUCCESS) return status_text("cufftSetStream", st);
    std::string err = queue_fft(e, in, out, d, theirs);
    if (auto st = set_stream(s.handle, ours); st != CUFFT_SUCCESS && err.empty()) err = status_text("cufftSetStream", st);
    return err;
}

// Every table a launch calls through, loaded now (a table loads on first use, which needs the GIL).
void load_launch_tables() {
    static_cast<void>(api());
    static_cast<void>(cudart::api());
    static_cast<void>(abi::cuda_driver::api());
    static_cast<void>(abi::nvshmem::api());
}

std::string where(const std::string& name, int device) {
    return name + " (device " + std::to_string(device) + ")";
}

}  // namespace

}  // namespace mpbind::cufftmp

namespace mpbind::launch {

Status fft(uint64_t id, uintptr_t stream, int device, const void* in, size_t in_bytes, void* out, size_t out_bytes,
           int direction) {
    using namespace cufftmp;
    std::shared_ptr<FftLaunch> f = registry<FftLaunch>().find(id);
    if (!f) return unknown("FFT plan", id);
    const Executor& e = f->exec;
    std::string name = where(e.name, e.device);
    if ((direction != CUFFT_FORWARD && direction != CUFFT_INVERSE) || !e.sides[Executor::slot(direction)]) {
        return Status::invalid(name + " does not transform in direction " + std::to_string(direction));
    }
    if (device != e.device) {
        return Status::invalid(name + ": the program runs on device " + std::to_string(device));
    }
    const auto& [src, dst] = *e.sides[Executor::slot(direction)];
    auto want_in = static_cast<size_t>(src.rows * src.row_bytes), want_out = static_cast<size_t>(dst.rows * dst.row_bytes);
    if (in_bytes != want_in || out_bytes != want_out) {
        return Status::invalid(name + ": this rank's pieces are " + std::to_string(want_in) + " bytes in and " +
                               std::to_string(want_out) + " out, not " + std::to_string(in_bytes) + " and " +
                               std::to_string(out_bytes));
    }
    // One launch at a time (the buffer, the events and the plan's stream are the plan's), and a release
    // settles after this launch has queued (and noted) its work.
    auto gate = nvshmem::launch_gate();
    if (e.plan->releasing() || e.desc->releasing()) return Status::invalid(name + " is closed");
    std::string err = launch_fft(*f, stream, in, out, direction);
    if (!nvshmem::note_launched(stream) && err.empty()) err = "no event could be recorded after its work";
    return err.empty() ? Status{} : Status::failed(name + ": " + err);
}

Status reshape(uint64_t id, uintptr_t stream, int device, const void* in, size_t in_bytes, void* out,
               size_t out_bytes) {
    using namespace cufftmp;
    std::shared_ptr<ReshapeLaunch> r = registry<ReshapeLaunch>().find(id);
    if (!r) return unknown("reshape plan", id);
    std::string name = where("the reshape plan", r->device);
    if (device != r->device) return Status::invalid(name + ": the program runs on device " + std::to_string(device));
    if (in_bytes != r->in_bytes || out_bytes != r->out_bytes) {
        return Status::invalid(name + ": this rank's pieces are " + std::to_string(r->in_bytes) + " bytes in and " +
                               std::to_string(r->out_bytes) + " out, not " + std::to_string(in_bytes) + " and " +
                               std::to_string(out_bytes));
    }
    auto gate = nvshmem::launch_gate();  // as launch::fft's
    bool released = r->reshape->releasing();
    for (const auto& b : r->buffers) released = released || b->releasing();
    if (released) return Status::invalid(name + " is closed");
    auto* st = reinterpret_cast<void*>(stream);
    int64_t in_n = static_cast<int64_t>(in_bytes), out_n = static_cast<int64_t>(out_bytes);
    std::string err = copy_rows(r->in_buf, in_n, in, in_n, in_n, 1, st);
    if (err.empty()) {
        // The other ranks write into this one's output buffer: all of them past their last use of it first.
        abi::nvshmem::api().nvshmemx_sync_all_on_stream.ptr(st);
        auto s = api().cufftMpExecReshapeAsync.ptr(r->reshape->handle, reinterpret_cast<void*>(r->out_buf),
                                                    reinterpret_cast<const void*>(r->in_buf),
                                                    reinterpret_cast<void*>(r->work), st);
        if (s != CUFFT_SUCCESS) err = status_text("cufftMpExecReshapeAsync", s);
    }
    if (err.empty()) err = copy_rows(reinterpret_cast<uintptr_t>(out), out_n, reinterpret_cast<const void*>(r->out_buf), out_n, out_n, 1, st);
    if (!nvshmem::note_launched(stream) && err.empty()) err = "no event could be recorded after its work";
    return err.empty() ? Status{} : Status::failed(name + ": " + err);
}

}  // namespace mpbind::launch

namespace mpbind::cufftmp {

namespace {

// --- reshape operations ---

Reshape create_reshape() {
    void* h = nullptr;
    call(api().cufftMpCreateReshape, &h);
    return Reshape(std::make_shared<ReshapeState>(h));
}

// The elements of a box check_box() accepted (0 <= lower <= upper: each difference fits).
long long box_elements(const std::vector<long long>& lower, const std::vector<long long>& upper, const char* what) {
    long long n = 1;
    for (size_t i = 0; i < lower.size(); ++i) n = checked_mul(n, upper[i] - lower[i], what);
    return n;
}

void make_reshape(Reshape& self, size_t element_size, const std::vector<long long>& lower_in,
                  const std::vector<long long>& upper_in, const std::vector<long long>& strides_in,
                  const std::vector<long long>& lower_out, const std::vector<long long>& upper_out,
                  const std::vector<long long>& strides_out, int comm_type, uintptr_t comm_handle, nb::object keep) {
    ReshapeState& s = self.get();
    if (element_size == 0) raise_usage("element_size must be > 0");
    size_t rank = lower_in.size();
    if (rank < 1 || rank > 3) raise_usage("boxes must have 1 to 3 dimensions, got " + std::to_string(rank));
    corner("upper_input", upper_in, rank);
    corner("strides_input", strides_in, rank);
    corner("lower_output", lower_out, rank);
    corner("upper_output", upper_out, rank);
    corner("strides_output", strides_out, rank);
    check_box("lower_input", lower_in, "upper_input", upper_in);
    check_box("lower_output", lower_out, "upper_output", upper_out);
    check_comm(comm_type, comm_handle);
    if (s.made) raise_usage("make: the reshape is already made; create a new Reshape");
    // Before the collective call: a refusal after it would leave the other PEs' reshapes made.
    long long in_elements = box_elements(lower_in, upper_in, "the input box's elements");
    long long out_elements = box_elements(lower_out, upper_out, "the output box's elements");
    checked_mul(static_cast<uint64_t>(in_elements), static_cast<uint64_t>(element_size), "the input box's bytes");
    checked_mul(static_cast<uint64_t>(out_elements), static_cast<uint64_t>(element_size), "the output box's bytes");
    nvshmem::settle_collectives();
    call(api().__cufftMpMakeReshape_11_4, s.handle, element_size, static_cast<int>(rank),
         lower_in.data(), upper_in.data(), strides_in.data(), lower_out.data(), upper_out.data(),
         strides_out.data(), reinterpret_cast<void*>(comm_handle), comm_type);
    s.made = true;
    s.became_collective();
    s.comm = std::move(keep);
    s.element_size = element_size;
    s.in_elements = static_cast<size_t>(in_elements);
    s.out_elements = static_cast<size_t>(out_elements);
}

ReshapeState& made_reshape(Reshape& self, const char* what) {
    ReshapeState& s = self.get();
    if (!s.made) raise_usage(std::string(what) + ": the reshape is not made yet (call make first)");
    return s;
}

size_t reshape_workspace(Reshape& self) {
    ReshapeState& s = made_reshape(self, "workspace_size");
    size_t n = 0;
    call(api().cufftMpGetReshapeSize, s.handle, &n);
    return n;
}

void exec_reshape(Reshape& self, uintptr_t out, uintptr_t in, uintptr_t workspace, nb::handle stream) {
    ReshapeState& s = made_reshape(self, "exec");
    if (s.out_elements != 0 && out == 0) raise_usage("exec: the output pointer is NULL");
    if (s.in_elements != 0 && in == 0) raise_usage("exec: the input pointer is NULL");
    uintptr_t st = stream_handle(stream);
    nvshmem::CollectiveCall collective("cufftmp.reshape", st);
    call(api().cufftMpExecReshapeAsync, s.handle, reinterpret_cast<void*>(out),
         reinterpret_cast<const void*>(in), reinterpret_cast<void*>(workspace), reinterpret_cast<void*>(st));
    collective.queued();
}

std::string plan_repr(Plan& p) {
    auto& s = *p.state();
    if (s.closed()) return "<cufftmp.Plan closed>";
    std::string r = "<cufftmp.Plan handle=" + std::to_string(s.handle);
    if (s.made()) {
        r += std::string(" ") + type_name(s.fft_type) + " ";
        for (size_t i = 0; i < s.shape.size(); ++i) r += (i ? "x" : "") + std::to_string(s.shape[i]);
    } else {
        r += " not made";
    }
    r += s.comm_type == CUFFT_COMM_MPI ? " comm=MPI" : s.comm_type == CUFFT_COMM_NONE ? " comm=NONE" : "";
    return r + ">";
}

}  // namespace

}  // namespace mpbind::cufftmp

namespace mpbind {

void register_cufftmp(nb::module_& parent) {
    using namespace cufftmp;
    nb::module_ m = parent.def_submodule("cufftmp", "cuFFTMp objects of the core.");

    auto plan = nb::class_<Plan>(
        m, "Plan",
        "A cuFFTMp plan (cufftCreate). Destruction is collective once a communicator is attached: "
        "close() on every PE, or drop it and drain() on every PE.");
    plan.def("__init__", [](Plan* self) { new (self) Plan(create_plan()); })
        .def("attach_comm", &attach_comm, nb::arg("comm_type"), nb::arg("comm_handle") = 0,
             nb::arg("comm") = nb::none())
        .def("set_stream", &set_stream, nb::arg("stream").none())
        .def("set_subformat_default", &set_subformat_default, nb::arg("subformat_forward"),
             nb::arg("subformat_inverse"))
        .def("set_distribution", &set_distribution, nb::arg("lower_input"), nb::arg("upper_input"),
             nb::arg("lower_output"), nb::arg("upper_output"), nb::arg("strides_input") = nb::none(),
             nb::arg("strides_output") = nb::none())
        .def("make_plan_2d", [](Plan& p, long long nx, long long ny, int t) { return make_plan(p, {nx, ny}, t); },
             nb::arg("nx"), nb::arg("ny"), nb::arg("fft_type"))
        .def("make_plan_3d",
             [](Plan& p, long long nx, long long ny, long long nz, int t) { return make_plan(p, {nx, ny, nz}, t); },
             nb::arg("nx"), nb::arg("ny"), nb::arg("nz"), nb::arg("fft_type"))
        .def("exec", [](Plan& p, nb::handle input, nb::handle output, nb::handle direction, nb::handle layout) {
            PlanState& s = p.get();
            if (!s.made()) raise_usage("exec: the plan is not made yet (call make_plan_2d/3d or a create_* method)");
            ExecCall c = plan_exec(s.fft_type, input, output, direction, layout);
            exec(p, c.in, c.out, c.direction);
        }, nb::arg("input").none(), nb::arg("output").none() = nb::none(), nb::arg("direction").none() = nb::none(),
             nb::arg("layout").none() = nb::none())
        .def("malloc", &xt_malloc, nb::arg("format"))
        .def("exec_descriptor", &exec_descriptor, nb::arg("input"), nb::arg("output").none(),
             nb::arg("direction"))
        .def("executor", &make_executor, nb::arg("descriptor"), nb::arg("sides"), nb::arg("need"),
             nb::arg("via_descriptor"), nb::arg("device"), nb::arg("name"))
        .def_prop_ro("handle", [](Plan& p) { return p.get().handle; })
        .def_prop_ro("fft_type", [](Plan& p) -> std::optional<int> {
            auto& s = p.get();
            if (!s.made()) return std::nullopt;
            return s.fft_type;
        })
        .def_prop_ro("shape", [](Plan& p) { return p.get().shape; })
        .def_prop_ro("work_size", [](Plan& p) { return p.get().work_size; })
        .def_prop_ro("comm_type", [](Plan& p) -> std::optional<int> {
            auto& s = p.get();
            if (s.comm_type == -1) return std::nullopt;
            return s.comm_type;
        }, "The attached CommType, or None.")
        .def_prop_ro("stream", [](Plan& p) { return p.get().stream; })
        .def_prop_ro("distributed", [](Plan& p) { return p.get().distributed; },
                     "True when cufftXtSetDistribution set its boxes.")
        .def("destroy", [](Plan& p) { p.close(); })
        .def("__repr__", &plan_repr);
    bind_lifetime(plan, "Free its descriptors, then cufftDestroy (collective with a communicator). Idempotent.");

    nb::module_ testing = nb::borrow<nb::module_>(parent.attr("_testing"));
    testing.def("cufftmp_exec", [](int fft_type, nb::handle input, nb::handle output, nb::handle direction,
                                   nb::handle layout) {
        check_type(fft_type);
        ExecCall c = plan_exec(fft_type, input, output, direction, layout);
        return nb::make_tuple(c.in, c.out, c.direction);
    }, nb::arg("fft_type"), nb::arg("input").none(), nb::arg("output").none() = nb::none(),
       nb::arg("direction").none() = nb::none(), nb::arg("layout").none() = nb::none(),
       "The checks of Plan.exec on a made plan of `fft_type`, without cuFFTMp: (input, output (0: in place), "
       "direction) as cufftExec* would get them.");

    // --- launches from a framework's program (mpbind.jax) ---
    m.def("launch_register_fft", [](const Executor& e) {
        if (!e.plan) raise_usage("a test double's executor cannot be launched");
        e.check_open();
        load_launch_tables();
        auto f = std::make_shared<FftLaunch>();
        f->exec = e;
        if (e.plan->stream != 0) {
            const auto& d = abi::cuda_driver::api();
            call(d.cuEventCreate, &f->before, static_cast<unsigned>(abi::cuda_driver::CU_EVENT_DISABLE_TIMING));
            call(d.cuEventCreate, &f->after, static_cast<unsigned>(abi::cuda_driver::CU_EVENT_DISABLE_TIMING));
        }
        return launch::registry<FftLaunch>().add(std::move(f));
    }, nb::arg("executor"), "Register a made FFT plan's executor for launches from a framework's program; its id.");
    m.def("launch_register_reshape", [](Reshape& r, nb::handle arrays, uintptr_t in_buf, uintptr_t out_buf,
                                        uintptr_t work, size_t in_bytes, size_t out_bytes, int device) {
        made_reshape(r, "launch_register_reshape");
        load_launch_tables();
        std::vector<std::shared_ptr<State>> buffers;
        for (nb::handle a : arrays) buffers.push_back(nvshmem::symmetric_state(a));
        if ((in_bytes && !in_buf) || (out_bytes && !out_buf)) raise_usage("a reshape's buffers must not be NULL");
        auto entry = std::make_shared<ReshapeLaunch>();
        entry->reshape = r.state();
        entry->buffers = std::move(buffers);
        entry->in_buf = in_buf;
        entry->out_buf = out_buf;
        entry->work = work;
        entry->in_bytes = in_bytes;
        entry->out_bytes = out_bytes;
        entry->device = device;
        return launch::registry<ReshapeLaunch>().add(std::move(entry));
    }, nb::arg("reshape"), nb::arg("arrays"), nb::arg("in_buf"), nb::arg("out_buf"), nb::arg("work"),
          nb::arg("in_bytes"), nb::arg("out_bytes"), nb::arg("device"),
          "Register a made reshape and its plan's symmetric buffers (`arrays`, the core's SymmetricArrays holding "
          "them: its largest pieces, allocated alike on every rank) for launches from a framework's program; its id.");
    m.def("launch_release", [](uint64_t id) {
        bool fft = launch::registry<FftLaunch>().take(id);
        return fft || launch::registry<ReshapeLaunch>().take(id);
    }, nb::arg("id"), "Forget a plan's launch id; False when none is registered under it.");
    m.def("launch_fft", [](uint64_t id, uintptr_t stream, int device, uintptr_t in, size_t in_bytes, uintptr_t out,
                           size_t out_bytes, int direction) {
        launch::Status st;
        {
            nb::gil_scoped_release release;  // as a framework's thread calls it
            st = launch::fft(id, stream, device, reinterpret_cast<const void*>(in), in_bytes,
                             reinterpret_cast<void*>(out), out_bytes, direction);
        }
        return nb::make_tuple(static_cast<int>(st.code), st.message);
    }, nb::arg("id"), nb::arg("stream"), nb::arg("device"), nb::arg("input"), nb::arg("in_bytes"), nb::arg("output"),
          nb::arg("out_bytes"), nb::arg("direction"),
          "launch::fft as a framework's handler calls it (GIL released): (status code, message).");
    m.def("launch_reshape", [](uint64_t id, uintptr_t stream, int device, uintptr_t in, size_t in_bytes, uintptr_t out,
                               size_t out_bytes) {
        launch::Status st;
        {
            nb::gil_scoped_release release;
            st = launch::reshape(id, stream, device, reinterpret_cast<const void*>(in), in_bytes,
                                 reinterpret_cast<void*>(out), out_bytes);
        }
        return nb::make_tuple(static_cast<int>(st.code), st.message);
    }, nb::arg("id"), nb::arg("stream"), nb::arg("device"), nb::arg("input"), nb::arg("in_bytes"), nb::arg("output"),
          nb::arg("out_bytes"), "launch::reshape as a framework's handler calls it (GIL released): (status code, message).");

    nb::class_<Executor>(
        m, "Executor",
        "A made plan's execute as one call: checks, the copies into and out of its buffer, the transform, on "
        "its stream (Plan.executor).")
        .def("execute", &Executor::execute, nb::arg("x").none(), nb::arg("room"), nb::arg("out").none(),
             nb::arg("direction"),
             "Transform `x` (None: the buffer) in `direction`: `x` and `out` (None: none) are checked against this "
             "PE's sides; `x` is used in place when it is stored as the plan stores it, writable, and holds `need` "
             "bytes of symmetric memory from its start (`room`: what a view of ours says, -1: look it up), else "
             "copied into the buffer; the result is copied into `out` when given. Returns (the pointer "
             "transformed, True when that is `x` itself or the buffer for `x` None).")
        .def("run", &Executor::run, nb::arg("ptr"), nb::arg("direction"),
             "Transform what `ptr` (checked by an earlier execute) holds, in place, in `direction`.")
        .def_prop_ro("recorded", [](Executor& e) { return e.recorded; },
                     nb::for_getter(nb::sig("def recorded(self, /) -> list[tuple[typing.Any, ...]]")),
                     "A test double's calls (_testing.cufftmp_executor); empty for a plan's.");
    testing.def("cufftmp_executor", [](nb::handle sides, long long need, uintptr_t buffer, int device,
                                       bool via_descriptor, std::string name,
                                       std::vector<std::pair<uintptr_t, size_t>> heap) {
        Executor e;
        set_sides(e, sides);
        e.need = need;
        e.via_descriptor = via_descriptor;
        e.device = device;
        e.name = std::move(name);
        e.buffer = buffer;
        e.heap = std::move(heap);
        return e;
    }, nb::arg("sides"), nb::arg("need"), nb::arg("buffer"), nb::arg("device"), nb::arg("via_descriptor"),
       nb::arg("name"), nb::arg("heap"),
       "An Executor without cuFFTMp whose copies and transforms are recorded (its `recorded` list) instead of "
       "made; `heap` holds the (ptr, nbytes) ranges taken as symmetric memory.");

    auto desc = nb::class_<Descriptor>(
        m, "Descriptor",
        "Distributed data from cufftXtMalloc. Freeing it is collective: close() on every PE, or drop it "
        "and drain() on every PE. Its plan frees it first when closed.");
    desc.def("memcpy", &memcpy_host, nb::arg("host_ptr"), nb::arg("copy_type"),
             "cufftXtMemcpy between this PE's part and host memory at `host_ptr` "
             "(HOST_TO_DEVICE: into the descriptor; DEVICE_TO_HOST: out of it). Not redistributed.")
        .def("copy_from", &copy_from, nb::arg("src"))
        .def_prop_ro("ptr", [](Descriptor& d) { return reinterpret_cast<uintptr_t>(d.get().desc); })
        .def_prop_ro("data", [](Descriptor& d) { return reinterpret_cast<uintptr_t>(local(d.get()).data[0]); })
        .def_prop_ro("nbytes", [](Descriptor& d) { return local(d.get()).size[0]; })
        .def_prop_ro("subformat", [](Descriptor& d) { return d.get().desc->subFormat; })
        .def_prop_ro("format", [](Descriptor& d) { return d.get().format; }, "The format it was allocated with.")
        .def("__repr__", [](Descriptor& d) {
            auto& s = *d.state();
            if (s.closed()) return std::string("<cufftmp.Descriptor closed>");
            return "<cufftmp.Descriptor subformat=" + std::to_string(s.desc->subFormat) + ">";
        });
    bind_lifetime(desc, "cufftXtFree (collective). Idempotent.");

    auto reshape = nb::class_<Reshape>(
        m, "Reshape",
        "A cuFFTMp reshape (cufftMpCreateReshape). Destruction is collective once made: close() on every PE, "
        "or drop it and drain() on every PE.");
    reshape.def("__init__", [](Reshape* self) { new (self) Reshape(create_reshape()); })
        .def("make", &make_reshape, nb::arg("element_size"), nb::arg("lower_input"), nb::arg("upper_input"),
             nb::arg("strides_input"), nb::arg("lower_output"), nb::arg("upper_output"), nb::arg("strides_output"),
             nb::arg("comm_type"), nb::arg("comm_handle") = 0, nb::arg("comm") = nb::none())
        .def("workspace_size", &reshape_workspace)
        .def("exec", &exec_reshape, nb::arg("output"), nb::arg("input"), nb::arg("workspace"),
             nb::arg("stream").none() = nb::none())
        .def_prop_ro("made", [](Reshape& r) { return r.get().made; })
        .def_prop_ro("element_size", [](Reshape& r) { return r.get().element_size; })
        .def_prop_ro("input_elements", [](Reshape& r) { return r.get().in_elements; },
                     "Elements of this PE's input box.")
        .def_prop_ro("output_elements", [](Reshape& r) { return r.get().out_elements; },
                     "Elements of this PE's output box.")
        .def("destroy", [](Reshape& r) { r.close(); })
        .def("__repr__", [](Reshape& r) {
            auto& s = *r.state();
            if (s.closed()) return std::string("<cufftmp.Reshape closed>");
            return std::string("<cufftmp.Reshape ") + (s.made ? "made" : "not made") + ">";
        });
    bind_c_pointer(reshape, [](Reshape& r) { return r.get().handle; },
                   "The cufftReshapeHandle, for the flat bindings.");
    bind_lifetime(reshape, "cufftMpDestroyReshape (collective once made). Idempotent.");
}

}  // namespace mpbind
