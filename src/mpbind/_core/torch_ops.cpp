// NCCL collectives as PyTorch operators with C++ kernels (mpbind::nccl_all_reduce, nccl_all_gather,
// nccl_reduce_scatter, nccl_all_to_all, and nccl_all_reduce_ in place), registered into a process that
// imported torch.
//
// Why C++: a compiled torch program calls each operator through the dispatcher, and a Python kernel
// there costs tens of microseconds (the call into Python and back, paid on every step); these leave
// the dispatcher's C++ path, the output's allocation and the launch (a compiled function with the
// all-reduce: 0.77-0.84x the time it takes with the Python operator on one H200).
// Why not a torch extension: one built against torch's C++ API must be rebuilt for every torch
// release. The kernels here use only torch's stable C shim (torch/csrc/inductor/aoti_torch/c/shim.h:
// C functions whose signatures torch keeps across releases), looked up in the libtorch the process
// has already loaded, when mpbind.torch asks (torch_ops_register): the core builds and imports
// without torch, and one build serves every torch whose shim has these functions. (One C++ function
// is looked up besides, optionally: libtorch_python's THPVariable_Wrap, for eager calls' outputs.)
//
// Each kernel takes this rank's contiguous CUDA tensor and the communicator's launch id (what
// Communicator.launch_id registers), allocates its output with torch's allocator, and queues the
// collective on torch's current stream through launch::collective (nccl.cpp): the checks, the
// communicator's health, its lock and flight record are those of every launch from a compiled
// program. A refusal throws std::runtime_error (a RuntimeError in Python) naming what was wrong;
// the Python operators check their arguments before tracing, so that a refusal comes before the
// first collective step on every rank.
//
// Eagerly the same kernels run without the dispatcher (torch_eager, and the gate mpbind.torch asks
// first): its entry and the output's way through it were most of an eager call's cost. Such a call
// reads the tensor and finds torch's stream through the DLPack C exchange API of the tensor's type,
// makes its output as the kernels do (wrapped for Python by libtorch_python; through the exchange
// API's allocator where that cannot be), and raises mpbind's errors.

#include <dlfcn.h>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "launch.hpp"
#include "nccl.hpp"
#include "register.hpp"

namespace nb = nanobind;

namespace mpbind::torch_ops {
namespace {

// The shim's types, as shim.h declares them: an opaque tensor handle (owned: deleted by whoever
// holds it), a stack slot of a boxed call, a library handle; every function returns 0 on success.
using Tensor = void*;
using StableIValue = uint64_t;
using Error = int32_t;
using Boxed = void (*)(StableIValue*, uint64_t, uint64_t);

struct Shim {
    Error (*library_init_fragment)(const char*, const char*, uint32_t, void**) = nullptr;
    Error (*library_init_impl)(const char*, const char*, const char*, uint32_t, void**) = nullptr;
    Error (*library_def)(void*, const char*) = nullptr;
    Error (*library_impl)(void*, const char*, Boxed) = nullptr;
    Error (*delete_tensor)(Tensor) = nullptr;
    Error (*data_ptr)(Tensor, void**) = nullptr;
    Error (*dim)(Tensor, int64_t*) = nullptr;
    Error (*sizes)(Tensor, int64_t**) = nullptr;
    Error (*dtype)(Tensor, int32_t*) = nullptr;
    Error (*device_type)(Tensor, int32_t*) = nullptr;
    Error (*device_index)(Tensor, int32_t*) = nullptr;
    Error (*is_contiguous)(Tensor, bool*) = nullptr;
    Error (*numel)(Tensor, int64_t*) = nullptr;
    Error (*empty_strided)(int64_t, const int64_t*, const int64_t*, int32_t, int32_t, int32_t, Tensor*) = nullptr;
    Error (*current_cuda_stream)(int32_t, void**) = nullptr;  // libtorch_cuda: absent from a CPU-only torch
    int32_t cuda = -1;                                         // the CUDA device type's code
    // torch's dtype codes -> (ncclDataType_t, how many of them one element is); -1 where NCCL has none
    std::vector<std::pair<int, int>> nccl_types;
    // arrays::Dtype -> torch's dtype code, of the types NCCL moves; -1 for the others
    std::array<int32_t, static_cast<size_t>(arrays::Dtype::kFloat8E5M2) + 1> torch_dtypes{};
    // libtorch_python's THPVariable_Wrap(const at::TensorBase&) and THPVariableClass (torch.Tensor), or
    // null: how an eager call hands its output to Python (see torch_tensor)
    PyObject* (*wrap)(const void*) = nullptr;
    PyObject** tensor_class = nullptr;
};

Shim shim;
bool registered = false;

template <class F>
void find(void* lib, const char* name, F& fn, bool required = true) {
    fn = reinterpret_cast<F>(dlsym(lib, name));
    if (!fn && required) {
        throw std::runtime_error(std::string("this PyTorch's libtorch has no ") + name +
                                 " (its stable C shim is older than mpbind's torch operators need)");
    }
}

void* loaded(const std::string& path) {
    if (path.empty()) return nullptr;
    // RTLD_NOLOAD: the library torch loaded, or nothing (never a second copy); by its file name too,
    // which matches the loaded library's soname wherever the installation put it
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    size_t slash = path.rfind('/');
    if (!lib && slash != std::string::npos) lib = dlopen(path.substr(slash + 1).c_str(), RTLD_NOW | RTLD_NOLOAD);
    return lib;
}

void check(Error e, const char* what) {
    if (e != 0) throw std::runtime_error(std::string("torch's ") + what + " failed");
}

// A tensor handle this code owns: deleted unless released into the stack.
struct Owned {
    Tensor h = nullptr;
    explicit Owned(Tensor t) : h(t) {}
    Owned(const Owned&) = delete;
    Owned& operator=(const Owned&) = delete;
    ~Owned() {
        if (h) shim.delete_tensor(h);
    }
    Tensor release() {
        Tensor t = h;
        h = nullptr;
        return t;
    }
};

// The operators' names, in launch::Collective's order.
constexpr const char* kOpNames[] = {"mpbind::nccl_all_reduce", "mpbind::nccl_all_gather", "mpbind::nccl_reduce_scatter",
                                    "mpbind::nccl_all_to_all"};

// This rank's tensor as a collective sees it.
struct Piece {
    void* ptr = nullptr;
    size_t bytes = 0;
    int nccl_type = 0;
    int per_element = 1;  // NCCL elements per tensor element (2 for a complex tensor's real view)
    int32_t dtype = 0, device = 0;
    std::vector<int64_t> sizes;
};

Piece piece(Tensor t, const char* op) {
    Piece p;
    int32_t type = 0;
    check(shim.device_type(t, &type), "device type query");
    if (type != shim.cuda) {
        throw std::runtime_error(std::string(op) + " takes CUDA tensors, not a " +
                                 (type == 0 ? std::string("cpu") : "device type " + std::to_string(type)) + " tensor");
    }
    bool contiguous = false;
    check(shim.is_contiguous(t, &contiguous), "contiguity query");
    if (!contiguous) throw std::runtime_error(std::string(op) + " takes a contiguous tensor");
    check(shim.dtype(t, &p.dtype), "dtype query");
    if (p.dtype < 0 || static_cast<size_t>(p.dtype) >= shim.nccl_types.size() || shim.nccl_types[p.dtype].first < 0) {
        throw std::runtime_error(std::string(op) + ": NCCL has no type for torch dtype code " + std::to_string(p.dtype));
    }
    p.nccl_type = shim.nccl_types[p.dtype].first;
    p.per_element = shim.nccl_types[p.dtype].second;
    check(shim.device_index(t, &p.device), "device index query");
    int64_t ndim = 0, n = 0;
    int64_t* sizes = nullptr;
    check(shim.dim(t, &ndim), "dim query");
    check(shim.sizes(t, &sizes), "sizes query");
    check(shim.numel(t, &n), "numel query");
    p.sizes.assign(sizes, sizes + ndim);
    auto unit = static_cast<uint64_t>(launch::kNcclTypeSizes[p.nccl_type]) * static_cast<uint64_t>(p.per_element);
    if (n < 0 || static_cast<uint64_t>(n) > std::numeric_limits<size_t>::max() / unit) {
        throw std::runtime_error(std::string(op) + ": " + std::to_string(n) + " elements overflow a size");
    }
    p.bytes = static_cast<size_t>(n) * unit;
    check(shim.data_ptr(t, &p.ptr), "data pointer query");
    return p;
}

// A new contiguous tensor of `sizes`, torch dtype code `dtype`, on CUDA device `device`; its data
// pointer in `data`. What the kernels and the eager calls make their outputs with.
Tensor empty(const std::vector<int64_t>& sizes, int32_t dtype, int32_t device, void*& data) {
    std::vector<int64_t> strides(sizes.size());
    int64_t stride = 1;
    for (size_t i = sizes.size(); i-- > 0;) {
        strides[i] = stride;
        stride *= sizes[i] > 0 ? sizes[i] : 1;
    }
    Tensor made = nullptr;
    check(shim.empty_strided(static_cast<int64_t>(sizes.size()), sizes.data(), strides.data(), dtype, shim.cuda,
                             device, &made),
          "allocation");
    Owned out(made);
    check(shim.data_ptr(out.h, &data), "data pointer query");
    return out.release();
}

int64_t as_int(StableIValue v) { return static_cast<int64_t>(v); }

// What the kernels refuse (a RuntimeError through torch's dispatcher, a UsageError called eagerly).
struct Refused : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The group size an operator was traced with, the same bound as the Python operators' (MAX_RANKS).
int64_t group(int64_t g, const char* op) {
    if (g < 1 || g > (int64_t{1} << 20)) {
        throw Refused(std::string(op) + ": group_size must be in [1, 1048576], not " + std::to_string(g));
    }
    return g;
}

int reduction(int64_t r, int per_element, const char* op) {
    if (r < 0 || r > 4) throw Refused(std::string(op) + ": ncclRedOp_t " + std::to_string(r) + " is not sum .. avg");
    if (per_element == 2 && r != 0 && r != 4) {
        throw Refused(std::string(op) + ": a " + launch::kNcclRedOpNames[r] +
                      " of complex tensors is not defined (sum and avg are, over the real and imaginary parts)");
    }
    return static_cast<int>(r);
}

size_t times(size_t bytes, int64_t k, const char* op) {
    if (bytes > std::numeric_limits<size_t>::max() / static_cast<size_t>(k)) {
        throw Refused(std::string(op) + ": the output's size overflows");
    }
    return bytes * static_cast<size_t>(k);
}

// A collective's output from this rank's `sizes` and `bytes` on a group of `g`: all_gather stacks
// the ranks' pieces along dim 0 ([g] of a 0-d tensor), reduce_scatter keeps block `rank` of `g`
// equal blocks along dim 0, all_to_all (whose blocks must be equal too; g is 0 where its operator
// does not know the group, and the launch checks the elements) and all_reduce keep the input's shape.
struct Output {
    std::vector<int64_t> sizes;
    size_t bytes;
};

Output output_of(launch::Collective kind, std::vector<int64_t> sizes, size_t bytes, int64_t g, const char* op) {
    Output o{std::move(sizes), bytes};
    if (kind == launch::Collective::kAllGather) {
        if (o.sizes.empty()) {
            o.sizes.push_back(g);
        } else if (o.sizes[0] > std::numeric_limits<int64_t>::max() / g) {
            throw Refused(std::string(op) + ": the output's size overflows");
        } else {
            o.sizes[0] *= g;
        }
        o.bytes = times(bytes, g, op);
    } else if (kind == launch::Collective::kReduceScatter || (kind == launch::Collective::kAllToAll && g > 0)) {
        if (o.sizes.empty() || o.sizes[0] % g) {
            throw Refused(std::string(op) + ": dim 0 does not split into " + std::to_string(g) + " equal blocks");
        }
        if (kind == launch::Collective::kReduceScatter) {
            o.sizes[0] /= g;
            o.bytes = bytes / static_cast<size_t>(g);
        }
    }
    return o;
}

// Queue the collective from `in` into `out_ptr` on torch's current stream.
void queue(const char* op, launch::Collective kind, uint64_t comm, const Piece& in, void* out_ptr, size_t out_bytes,
           int red) {
    void* stream = nullptr;
    if (!shim.current_cuda_stream) throw std::runtime_error(std::string(op) + ": this PyTorch has no CUDA streams");
    check(shim.current_cuda_stream(in.device, &stream), "current CUDA stream query");
    launch::Status st;
    {
        // a launch may wait (bounded) for the communicator; other Python threads run meanwhile
        std::optional<nb::gil_scoped_release> unlocked;
        if (PyGILState_Check()) unlocked.emplace();
        st = launch::collective(comm, kind, reinterpret_cast<uintptr_t>(stream), in.device, in.ptr, in.bytes, out_ptr,
                                out_bytes, in.nccl_type, red);
    }
    if (!st.ok()) throw std::runtime_error(std::string(op) + ": " + st.message);
}

// The four kernels: (x, comm, [op], [group_size]) on the stack, the output put in x's place.
template <launch::Collective kind>
void kernel(StableIValue* stack, uint64_t, uint64_t) {
    constexpr bool reduces = kind == launch::Collective::kAllReduce || kind == launch::Collective::kReduceScatter;
    constexpr bool grouped = kind == launch::Collective::kAllGather || kind == launch::Collective::kReduceScatter;
    const char* op = kOpNames[static_cast<int>(kind)];
    Owned x(reinterpret_cast<Tensor>(stack[0]));
    Piece p = piece(x.h, op);
    int red = reduces ? reduction(as_int(stack[2]), p.per_element, op) : 0;
    int64_t g = grouped ? group(as_int(stack[reduces ? 3 : 2]), op) : kind == launch::Collective::kAllToAll ? 0 : 1;
    Output o = output_of(kind, std::move(p.sizes), p.bytes, g, op);  // (p's extents are not read again)
    void* out_ptr = nullptr;
    Owned out(empty(o.sizes, p.dtype, p.device, out_ptr));
    queue(op, kind, static_cast<uint64_t>(stack[1]), p, out_ptr, o.bytes, red);
    stack[0] = reinterpret_cast<StableIValue>(out.release());
}

// nccl_all_reduce_(Tensor(a!) x, int comm, int op) -> (): the all-reduce into x itself. Compiled
// programs get it where mpbind.torch.all_reduce is traced: its functional form on a copy of the
// input, which inductor puts back in place on a buffer nothing else reads (no allocation, no copy).
void all_reduce_in_place(StableIValue* stack, uint64_t, uint64_t) {
    const char* op = "mpbind::nccl_all_reduce_";
    Owned x(reinterpret_cast<Tensor>(stack[0]));
    Piece p = piece(x.h, op);
    int red = reduction(as_int(stack[2]), p.per_element, op);
    queue(op, launch::Collective::kAllReduce, static_cast<uint64_t>(stack[1]), p, p.ptr, p.bytes, red);
}

// --- eager calls ---------------------------------------------------------------------------------

// A new contiguous torch.Tensor of `sizes`, torch dtype code `dtype`, on CUDA device `device` (its
// data pointer in `ptr`), made as the kernels make their outputs and handed to Python by
// libtorch_python's THPVariable_Wrap. Why not the exchange API's allocator: that one wraps torch's
// allocation in a DLPack tensor and back into a second torch tensor, ~0.45 µs of an eager call
// measured on one H200. A shim handle is an at::Tensor* (the shim's own convention), which is the
// reference THPVariable_Wrap takes; found by its C++ name, it is absent where torch's C++ ABI
// differs, and the exchange API serves (torch_made).
nb::object torch_tensor(const std::vector<int64_t>& sizes, int32_t dtype, int device, uintptr_t& ptr, const char* op) {
    Tensor handle = nullptr;
    void* data = nullptr;
    try {
        handle = empty(sizes, dtype, device, data);
    } catch (const std::runtime_error&) {  // torch has logged why (out of memory, most likely)
        std::string shape;
        for (int64_t n : sizes) shape += (shape.empty() ? "" : ", ") + std::to_string(n);
        raise_mpbind(std::string(op) + ": torch could not allocate the output (" + shape + ")");
    }
    Owned t(handle);  // THPVariable_Wrap takes its own reference to the tensor
    PyObject* obj = shim.wrap(t.h);
    if (obj == nullptr) throw nb::python_error();
    ptr = reinterpret_cast<uintptr_t>(data);
    return nb::steal(obj);
}

// Whether an eager call's output is made by torch_tensor: x's type is torch.Tensor itself, and
// libtorch_python's functions were found.
bool torch_made(nb::handle tensor_type) {
    return shim.wrap != nullptr && shim.tensor_class != nullptr && *shim.tensor_class == tensor_type.ptr();
}

// The kernels called from Python without torch's dispatcher, by mpbind.torch's functions where nothing
// else is to see the call (a plain CUDA tensor, eager, no mode or transform, no gradient wanted): the
// dispatcher's entry and the output's way through it are most of an eager operator's cost. The
// tensor is read, and its output made and handed back, through the DLPack C exchange API of its type
// (torch's allocator, torch's current stream, a torch.Tensor); the rules and the launch are the
// kernels'. Refusals are UsageError, a failed communicator raises its own error.

constexpr const char* kEagerNames[] = {"mpbind.torch.all_reduce", "mpbind.torch.all_gather",
                                       "mpbind.torch.reduce_scatter", "mpbind.torch.all_to_all"};

// (ncclDataType_t, NCCL elements per element) of a dtype NCCL moves (a complex one as two reals).
std::pair<int, int> nccl_type_of(arrays::Dtype d) {
    if (d == arrays::Dtype::kComplex64) return {arrays::info(arrays::Dtype::kFloat32).nccl, 2};
    if (d == arrays::Dtype::kComplex128) return {arrays::info(arrays::Dtype::kFloat64).nccl, 2};
    return {arrays::info(d).nccl, 1};
}

// The kernel on `x`, read as `a`, of the framework `producer` (torch's, `as_torch`: its output made
// by torch_tensor).
nb::object run_eager(launch::Collective kind, nb::handle x, const arrays::Array& a, const arrays::Producer& producer,
                     uint64_t comm, int64_t red_code, int64_t group_size, bool in_place, bool as_torch) {
    const char* op = in_place ? "mpbind.torch.all_reduce_" : kEagerNames[static_cast<int>(kind)];
    if (a.device < 0) raise_usage(std::string(op) + " takes CUDA tensors; x is in host memory");
    if (!a.contiguous) raise_usage(std::string(op) + " takes a contiguous tensor");
    auto [type, per_element] = nccl_type_of(a.dtype);
    if (type < 0) raise_usage(std::string(op) + ": NCCL has no type for " + arrays::name(a.dtype));
    bool reduces = kind == launch::Collective::kAllReduce || kind == launch::Collective::kReduceScatter;
    bool grouped = kind != launch::Collective::kAllReduce;  // all_to_all's blocks too (its operator has no size)
    Output o;
    int red = 0;
    try {
        red = reduces ? reduction(red_code, per_element, op) : 0;
        int64_t g = grouped ? group(group_size, op) : 1;
        o = output_of(kind, std::vector<int64_t>(a.shape.data(), a.shape.data() + a.shape.size()),
                      static_cast<size_t>(a.nbytes()), g, op);
    } catch (const Refused& e) {
        raise_usage(e.what());
    }
    nb::object out = nb::borrow(x);
    uintptr_t out_ptr = a.ptr;
    int32_t torch_dtype = as_torch ? shim.torch_dtypes[static_cast<size_t>(a.dtype)] : -1;
    if (!in_place && torch_dtype >= 0) {
        out = torch_tensor(o.sizes, torch_dtype, a.device, out_ptr, op);
    } else if (!in_place) {
        arrays::Dims dims;
        dims.resize_for_overwrite(o.sizes.size());
        for (size_t i = 0; i < o.sizes.size(); ++i) dims[i] = o.sizes[i];
        out = producer.empty(dims, a.dtype, a.device, out_ptr, op);
    }
    uintptr_t stream = producer.stream(a.device, op);
    launch::Status st;
    {
        nb::gil_scoped_release unlocked;  // a launch may wait (bounded) for the communicator
        st = launch::collective(comm, kind, stream, a.device, reinterpret_cast<const void*>(a.ptr),
                                static_cast<size_t>(a.nbytes()), reinterpret_cast<void*>(out_ptr), o.bytes, type, red,
                                /*interruptible=*/true);
    }
    if (!st.ok()) nccl::raise_launch(comm, st, op);
    return out;
}

launch::Collective kind_of(int code, bool in_place) {
    if (code < 0 || code > 3) raise_usage("unknown collective " + std::to_string(code));
    if (in_place && code != 0) raise_usage(std::string(kEagerNames[code]) + ": only an all-reduce works in place");
    return static_cast<launch::Collective>(code);
}

// The kernel on any tensor of a framework with the exchange API, a communicator's launch id, an
// ncclRedOp_t and the group size: what the gate calls, and tests call with made-up tensors.
nb::object eager(int kind_code, nb::handle x, uint64_t comm, int64_t red_code, int64_t group_size, bool in_place) {
    launch::Collective kind = kind_of(kind_code, in_place);
    arrays::Producer producer = arrays::Producer::of(x);
    if (!producer.valid()) {
        raise_type(std::string(kEagerNames[kind_code]) + ": x must be a tensor whose type makes tensors through "
                   "the DLPack C exchange API (torch.Tensor's since PyTorch 2.10), not a " + arrays::typename_of(x));
    }
    return run_eager(kind, x, arrays::describe(x, "x", false), producer, comm, red_code, group_size, in_place,
                     torch_made(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(x.ptr())))));
}

// Which calls go to the kernels directly: mpbind.torch's functions ask it first, and go on through the
// dispatcher where it returns None. It takes a call when x is exactly the tensor type, contiguous and
// on a CUDA device, the communicator exactly the communicator type (its launch id: `_launch`, else the
// `launch_id` property, which registers it), the reduction one of ncclRedOp_t's names, nothing asks
// for a gradient (x.requires_grad while grad mode is on) and each of `seen_by` (what else would see the
// call: a mode, a transform, a tracer) returns false. Python calls it as a plain function (eager_gate).
class Gate {
public:
    Gate(nb::handle tensor_type, nb::handle comm_type, nb::tuple seen_by, nb::object grad_enabled)
        : tensor_type_(nb::borrow(tensor_type)), comm_type_(nb::borrow(comm_type)),
          grad_enabled_(std::move(grad_enabled)), launch_(nb::str("_launch")), launch_id_(nb::str("launch_id")),
          requires_grad_(nb::str("requires_grad")) {
        for (nb::handle f : seen_by) seen_by_.push_back(nb::borrow(f));
        for (const char* name : launch::kNcclRedOpNames) names_.push_back(nb::str(name));
    }

    nb::object call(int kind_code, nb::handle x, nb::handle comm, nb::handle op, bool in_place) const {
        launch::Collective kind = kind_of(kind_code, in_place);
        if (!Py_IS_TYPE(x.ptr(), reinterpret_cast<PyTypeObject*>(tensor_type_.ptr())) ||
            !Py_IS_TYPE(comm.ptr(), reinterpret_cast<PyTypeObject*>(comm_type_.ptr()))) {
            return nb::none();
        }
        nb::object launch = nb::steal(PyObject_GetAttr(comm.ptr(), launch_.ptr()));
        if (!launch.is_valid()) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) throw nb::python_error();
            PyErr_Clear();
        }
        if (!launch.is_valid() || launch.is_none()) {  // not registered yet: the property registers it, once
            launch = nb::steal(PyObject_GetAttr(comm.ptr(), launch_id_.ptr()));
        }
        if (!launch.is_valid()) throw nb::python_error();
        if (!PyLong_CheckExact(launch.ptr())) return nb::none();
        uint64_t id = PyLong_AsUnsignedLongLong(launch.ptr());
        if (PyErr_Occurred()) throw nb::python_error();
        int64_t red = 0;
        if (kind == launch::Collective::kAllReduce || kind == launch::Collective::kReduceScatter) {
            red = reduction_code(op);
            if (red < 0) return nb::none();  // the Python path names what is wrong with it
        }
        for (const nb::object& f : seen_by_) {
            if (truthy(f)) return nb::none();
        }
        nb::object wants = nb::steal(PyObject_GetAttr(x.ptr(), requires_grad_.ptr()));
        if (!wants.is_valid()) throw nb::python_error();
        if (wants.ptr() == Py_True && truthy(grad_enabled_)) return nb::none();
        arrays::Producer producer = arrays::Producer::of(x);
        if (!producer.valid()) return nb::none();
        arrays::Array a = arrays::describe(x, "x", false);
        if (a.device < 0 || !a.contiguous) return nb::none();
        int64_t g = kind == launch::Collective::kAllReduce ? 1 : nccl::launch_size(id);
        return run_eager(kind, x, a, producer, id, red, g > 0 ? g : 1, in_place,  // an unknown id: refused there
                         torch_made(tensor_type_));
    }

private:
    static bool truthy(const nb::object& f) {
        nb::object r = nb::steal(PyObject_CallNoArgs(f.ptr()));
        if (!r.is_valid()) throw nb::python_error();
        int t = PyObject_IsTrue(r.ptr());
        if (t < 0) throw nb::python_error();
        return t != 0;
    }
    int64_t reduction_code(nb::handle op) const {
        if (!PyUnicode_Check(op.ptr())) return -1;
        for (size_t i = 0; i < names_.size(); ++i) {
            if (op.ptr() == names_[i].ptr() || PyUnicode_Compare(op.ptr(), names_[i].ptr()) == 0) {
                return static_cast<int64_t>(i);
            }
        }
        return -1;
    }

    nb::object tensor_type_, comm_type_, grad_enabled_;
    nb::str launch_, launch_id_, requires_grad_;
    std::vector<nb::object> seen_by_;
    std::vector<nb::str> names_;
};

// The gate as a function of (kind, x, comm, op, in_place), passed positionally: a function's
// vectorcall (a bound class's __call__ goes through type slots and an argument tuple: ~0.3 µs of an
// eager call on one H200). x, comm and op may be anything, None included: what the gate does not
// take, the Python path names.
nb::object eager_gate(nb::handle tensor_type, nb::handle comm_type, nb::tuple seen_by, nb::object grad_enabled) {
    auto gate = std::make_shared<const Gate>(tensor_type, comm_type, seen_by, std::move(grad_enabled));
    return nb::cpp_function(
        [gate](int kind, nb::handle x, nb::handle comm, nb::handle op, bool in_place) {
            return gate->call(kind, x, comm, op, in_place);
        },
        nb::arg("kind"), nb::arg("x").none(), nb::arg("comm").none(), nb::arg("op").none() = nb::none(),
        nb::arg("in_place") = false,
        nb::name("torch_eager_gate"), "Run the eager call, or return None where the dispatcher is to see it.");
}

struct Op {
    const char* name;
    const char* schema;
    Boxed kernel;
};

using launch::Collective;
constexpr Op kOps[] = {
    {"nccl_all_reduce", "nccl_all_reduce(Tensor x, int comm, int op) -> Tensor", &kernel<Collective::kAllReduce>},
    {"nccl_all_gather", "nccl_all_gather(Tensor x, int comm, int group_size) -> Tensor", &kernel<Collective::kAllGather>},
    {"nccl_reduce_scatter", "nccl_reduce_scatter(Tensor x, int comm, int op, int group_size) -> Tensor",
     &kernel<Collective::kReduceScatter>},
    {"nccl_all_to_all", "nccl_all_to_all(Tensor x, int comm) -> Tensor", &kernel<Collective::kAllToAll>},
    {"nccl_all_reduce_", "nccl_all_reduce_(Tensor(a!) x, int comm, int op) -> ()", &all_reduce_in_place},
};

// The shim's dtype codes of the types NCCL reduces, paired with their ncclDataType_t (nccl_type_of).
void dtypes(void* lib) {
    using arrays::Dtype;
    static constexpr std::pair<const char*, Dtype> kGetters[] = {
        {"aoti_torch_dtype_int8", Dtype::kInt8},           {"aoti_torch_dtype_uint8", Dtype::kUInt8},
        {"aoti_torch_dtype_int32", Dtype::kInt32},         {"aoti_torch_dtype_int64", Dtype::kInt64},
        {"aoti_torch_dtype_float16", Dtype::kFloat16},     {"aoti_torch_dtype_float32", Dtype::kFloat32},
        {"aoti_torch_dtype_float64", Dtype::kFloat64},     {"aoti_torch_dtype_bfloat16", Dtype::kBFloat16},
        {"aoti_torch_dtype_float8_e4m3fn", Dtype::kFloat8E4M3FN}, {"aoti_torch_dtype_float8_e5m2", Dtype::kFloat8E5M2},
        {"aoti_torch_dtype_complex64", Dtype::kComplex64}, {"aoti_torch_dtype_complex128", Dtype::kComplex128},
    };
    for (const auto& [name, dtype] : kGetters) {
        int32_t (*getter)() = nullptr;
        find(lib, name, getter);
        int32_t code = getter();
        if (code < 0 || code > 1024) throw std::runtime_error(std::string(name) + " gave " + std::to_string(code));
        if (shim.nccl_types.size() <= static_cast<size_t>(code)) shim.nccl_types.resize(static_cast<size_t>(code) + 1, {-1, 1});
        shim.nccl_types[static_cast<size_t>(code)] = nccl_type_of(dtype);
        shim.torch_dtypes[static_cast<size_t>(dtype)] = code;
    }
}

std::vector<std::string> register_ops(const std::string& cpu_library, const std::string& cuda_library,
                                      const std::string& python_library) {
    std::vector<std::string> names;
    for (const Op& op : kOps) names.emplace_back(op.name);
    if (registered) return names;
    void* cpu = loaded(cpu_library);
    if (!cpu) throw std::runtime_error("libtorch_cpu is not loaded from " + cpu_library + " (import torch first)");
    Shim s;
    find(cpu, "aoti_torch_library_init_fragment", s.library_init_fragment);
    find(cpu, "aoti_torch_library_init_impl", s.library_init_impl);
    find(cpu, "aoti_torch_library_def", s.library_def);
    find(cpu, "aoti_torch_library_impl", s.library_impl);
    find(cpu, "aoti_torch_delete_tensor_object", s.delete_tensor);
    find(cpu, "aoti_torch_get_data_ptr", s.data_ptr);
    find(cpu, "aoti_torch_get_dim", s.dim);
    find(cpu, "aoti_torch_get_sizes", s.sizes);
    find(cpu, "aoti_torch_get_dtype", s.dtype);
    find(cpu, "aoti_torch_get_device_type", s.device_type);
    find(cpu, "aoti_torch_get_device_index", s.device_index);
    find(cpu, "aoti_torch_is_contiguous", s.is_contiguous);
    find(cpu, "aoti_torch_get_numel", s.numel);
    find(cpu, "aoti_torch_empty_strided", s.empty_strided);
    int32_t (*cuda_type)() = nullptr;
    find(cpu, "aoti_torch_device_type_cuda", cuda_type);
    s.cuda = cuda_type();
    if (void* cuda_lib = loaded(cuda_library)) {
        find(cuda_lib, "aoti_torch_get_current_cuda_stream", s.current_cuda_stream, false);
    }
    if (void* python = loaded(python_library)) {  // both or neither
        find(python, "_Z16THPVariable_WrapRKN2at10TensorBaseE", s.wrap, false);
        find(python, "THPVariableClass", s.tensor_class, false);
        if (!s.wrap || !s.tensor_class) s.wrap = nullptr, s.tensor_class = nullptr;
    }
    s.torch_dtypes.fill(-1);
    shim = s;
    dtypes(cpu);
    // The libraries live as long as the process (torch's registrations refer to them).
    // The kernels at CUDA, and at CPU too, where they refuse the tensor naming the operator.
    void* def = nullptr;
    void* cuda = nullptr;
    void* cpu_impl = nullptr;
    check(shim.library_init_fragment("mpbind", __FILE__, __LINE__, &def), "library fragment");
    check(shim.library_init_impl("mpbind", "CUDA", __FILE__, __LINE__, &cuda), "library impl");
    check(shim.library_init_impl("mpbind", "CPU", __FILE__, __LINE__, &cpu_impl), "library impl");
    for (const Op& op : kOps) {
        check(shim.library_def(def, op.schema), "operator definition");
        check(shim.library_impl(cuda, op.name, op.kernel), "kernel registration");
        check(shim.library_impl(cpu_impl, op.name, op.kernel), "kernel registration");
    }
    registered = true;
    return names;
}

}  // namespace
}  // namespace mpbind::torch_ops

namespace mpbind {

void register_torch(nb::module_& m) {
    m.def("torch_ops_register", &torch_ops::register_ops, nb::arg("cpu_library"), nb::arg("cuda_library"),
          nb::arg("python_library") = "",
          "Register mpbind's C++ collective operators (mpbind::nccl_all_reduce, nccl_all_gather, nccl_reduce_scatter, "
          "nccl_all_to_all, nccl_all_reduce_; CUDA kernels) with the PyTorch this process loaded from these libraries (libtorch_cpu and "
          "libtorch_cuda, '' when torch has no CUDA; libtorch_python, where eager calls make their outputs' Python "
          "objects, '' for none); returns their names. Once per process.");
    m.def("torch_ops_wraps", [](nb::handle tensor_type) { return torch_ops::torch_made(tensor_type); },
          nb::arg("tensor_type"),
          "Whether eager calls on tensors of this type hand their outputs to Python through libtorch_python (found at "
          "registration: torch.Tensor itself), not through the DLPack C exchange API.");
    m.def("torch_ops_registered", [] { return torch_ops::registered; },
          "Whether torch_ops_register has registered the operators.");
    m.def("torch_eager", &torch_ops::eager, nb::arg("kind"), nb::arg("x"), nb::arg("comm"), nb::arg("op"),
          nb::arg("group_size"), nb::arg("in_place") = false,
          "The collective `kind` (0 all_reduce, 1 all_gather, 2 reduce_scatter, 3 all_to_all) of the CUDA tensor `x` "
          "over the communicator registered as `comm` (its launch_id), with the ncclRedOp_t `op` and the group size "
          "the output's shape assumes, queued on the current stream of x's framework: what the operators' kernels "
          "do, without torch's dispatcher. Returns the output, a new tensor of x's framework (x itself in place).");
    m.def("torch_eager_gate", &torch_ops::eager_gate, nb::arg("tensor_type"), nb::arg("comm_type"), nb::arg("seen_by"),
          nb::arg("grad_enabled"),
          "The gate of mpbind.torch's eager collectives (see torch_ops.cpp): a function of (kind, x, comm, op=None, "
          "in_place=False) that runs such a call with its C++ kernel, or returns None for the dispatcher's path.");
    m.def("torch_eager_ready", [](nb::handle x) { return arrays::Producer::of(x).valid(); }, nb::arg("x"),
          "Whether torch_eager can make tensors of x's type (its DLPack C exchange API has an allocator, a way "
          "back to Python and a current stream).");
}

}  // namespace mpbind
