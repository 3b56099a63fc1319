// NCCL collectives as PyTorch operators with C++ kernels (mpbind::nccl_all_reduce, nccl_all_gather,
// nccl_reduce_scatter, nccl_all_to_all), registered into a process that imported torch.
//
// Why C++: a compiled torch program calls each operator through the dispatcher, and a Python kernel
// there costs tens of microseconds (the call into Python and back, paid on every step); these leave
// the dispatcher's C++ path, the output's allocation and the launch (a compiled function with the
// all-reduce: 0.77-0.84x the time it takes with the Python operator on one H200).
// Why not a torch extension: one built against torch's C++ API must be rebuilt for every torch
// release. The kernels here use only torch's stable C shim (torch/csrc/inductor/aoti_torch/c/shim.h:
// C functions whose signatures torch keeps across releases), looked up in the libtorch the process
// has already loaded, when mpbind.torch asks (torch_ops_register): the core builds and imports
// without torch, and one build serves every torch whose shim has these functions.
//
// Each kernel takes this rank's contiguous CUDA tensor and the communicator's launch id (what
// Communicator.launch_id registers), allocates its output with torch's allocator, and queues the
// collective on torch's current stream through launch::collective (nccl.cpp): the checks, the
// communicator's health, its lock and flight record are those of every launch from a compiled
// program. A refusal throws std::runtime_error (a RuntimeError in Python) naming what was wrong;
// the Python operators check their arguments before tracing, so that a refusal comes before the
// first collective step on every rank.

#include <dlfcn.h>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "launch.hpp"
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

// A new contiguous tensor of `sizes`, the dtype and device of `like`.
Tensor empty(const std::vector<int64_t>& sizes, const Piece& like) {
    std::vector<int64_t> strides(sizes.size());
    int64_t stride = 1;
    for (size_t i = sizes.size(); i-- > 0;) {
        strides[i] = stride;
        stride *= sizes[i] > 0 ? sizes[i] : 1;
    }
    Tensor out = nullptr;
    check(shim.empty_strided(static_cast<int64_t>(sizes.size()), sizes.data(), strides.data(), like.dtype, shim.cuda,
                             like.device, &out),
          "allocation");
    return out;
}

int64_t as_int(StableIValue v) { return static_cast<int64_t>(v); }

// The group size an operator was traced with, the same bound as the Python operators' (MAX_RANKS).
int64_t group(StableIValue v, const char* op) {
    int64_t g = as_int(v);
    if (g < 1 || g > (int64_t{1} << 20)) {
        throw std::runtime_error(std::string(op) + ": group_size must be in [1, 1048576], not " + std::to_string(g));
    }
    return g;
}

int reduction(StableIValue v, const Piece& p, const char* op) {
    int64_t r = as_int(v);
    if (r < 0 || r > 4) throw std::runtime_error(std::string(op) + ": ncclRedOp_t " + std::to_string(r) + " is not sum .. avg");
    if (p.per_element == 2 && r != 0 && r != 4) {
        throw std::runtime_error(std::string(op) + ": only sum and avg are defined over complex tensors");
    }
    return static_cast<int>(r);
}

// Queue the collective on torch's current stream; the output's handle goes on the stack.
void run(StableIValue* stack, const char* op, launch::Collective kind, uint64_t comm, const Piece& in,
         const std::vector<int64_t>& out_sizes, size_t out_bytes, int red) {
    Owned out(empty(out_sizes, in));
    void* out_ptr = nullptr;
    check(shim.data_ptr(out.h, &out_ptr), "data pointer query");
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
    stack[0] = reinterpret_cast<StableIValue>(out.release());
}

size_t times(size_t bytes, int64_t k, const char* op) {
    if (bytes > std::numeric_limits<size_t>::max() / static_cast<size_t>(k)) {
        throw std::runtime_error(std::string(op) + ": the output's size overflows");
    }
    return bytes * static_cast<size_t>(k);
}

// nccl_all_reduce(Tensor x, int comm, int op) -> Tensor
void all_reduce(StableIValue* stack, uint64_t, uint64_t) {
    const char* op = "mpbind::nccl_all_reduce";
    Owned x(reinterpret_cast<Tensor>(stack[0]));
    Piece p = piece(x.h, op);
    int red = reduction(stack[2], p, op);
    run(stack, op, launch::Collective::kAllReduce, static_cast<uint64_t>(stack[1]), p, p.sizes, p.bytes, red);
}

// nccl_all_gather(Tensor x, int comm, int group_size) -> Tensor: [g * d0, ...] ([g] of a 0-d tensor)
void all_gather(StableIValue* stack, uint64_t, uint64_t) {
    const char* op = "mpbind::nccl_all_gather";
    Owned x(reinterpret_cast<Tensor>(stack[0]));
    Piece p = piece(x.h, op);
    int64_t g = group(stack[2], op);
    std::vector<int64_t> sizes = p.sizes;
    if (sizes.empty()) {
        sizes.push_back(g);
    } else if (sizes[0] > std::numeric_limits<int64_t>::max() / g) {
        throw std::runtime_error(std::string(op) + ": the output's size overflows");
    } else {
        sizes[0] *= g;
    }
    run(stack, op, launch::Collective::kAllGather, static_cast<uint64_t>(stack[1]), p, sizes, times(p.bytes, g, op), 0);
}

// nccl_reduce_scatter(Tensor x, int comm, int op, int group_size) -> Tensor: [d0 / g, ...]
void reduce_scatter(StableIValue* stack, uint64_t, uint64_t) {
    const char* op = "mpbind::nccl_reduce_scatter";
    Owned x(reinterpret_cast<Tensor>(stack[0]));
    Piece p = piece(x.h, op);
    int red = reduction(stack[2], p, op);
    int64_t g = group(stack[3], op);
    if (p.sizes.empty() || p.sizes[0] % g) {
        throw std::runtime_error(std::string(op) + ": dim 0 does not split into " + std::to_string(g) + " equal blocks");
    }
    std::vector<int64_t> sizes = p.sizes;
    sizes[0] /= g;
    run(stack, op, launch::Collective::kReduceScatter, static_cast<uint64_t>(stack[1]), p, sizes,
        p.bytes / static_cast<size_t>(g), red);
}

// nccl_all_to_all(Tensor x, int comm) -> Tensor
void all_to_all(StableIValue* stack, uint64_t, uint64_t) {
    const char* op = "mpbind::nccl_all_to_all";
    Owned x(reinterpret_cast<Tensor>(stack[0]));
    Piece p = piece(x.h, op);
    run(stack, op, launch::Collective::kAllToAll, static_cast<uint64_t>(stack[1]), p, p.sizes, p.bytes, 0);
}

struct Op {
    const char* name;
    const char* schema;
    Boxed kernel;
};

constexpr Op kOps[] = {
    {"nccl_all_reduce", "nccl_all_reduce(Tensor x, int comm, int op) -> Tensor", &all_reduce},
    {"nccl_all_gather", "nccl_all_gather(Tensor x, int comm, int group_size) -> Tensor", &all_gather},
    {"nccl_reduce_scatter", "nccl_reduce_scatter(Tensor x, int comm, int op, int group_size) -> Tensor", &reduce_scatter},
    {"nccl_all_to_all", "nccl_all_to_all(Tensor x, int comm) -> Tensor", &all_to_all},
};

// The shim's dtype codes of the types NCCL reduces, paired with their ncclDataType_t.
void dtypes(void* lib) {
    struct Pair {
        const char* getter;
        int nccl;
        int per_element;
    };
    static constexpr Pair kPairs[] = {
        {"aoti_torch_dtype_int8", 0, 1},    {"aoti_torch_dtype_uint8", 1, 1},         {"aoti_torch_dtype_int32", 2, 1},
        {"aoti_torch_dtype_int64", 4, 1},   {"aoti_torch_dtype_float16", 6, 1},       {"aoti_torch_dtype_float32", 7, 1},
        {"aoti_torch_dtype_float64", 8, 1}, {"aoti_torch_dtype_bfloat16", 9, 1},      {"aoti_torch_dtype_float8_e4m3fn", 10, 1},
        {"aoti_torch_dtype_float8_e5m2", 11, 1}, {"aoti_torch_dtype_complex64", 7, 2}, {"aoti_torch_dtype_complex128", 8, 2},
    };
    for (const Pair& pair : kPairs) {
        int32_t (*getter)() = nullptr;
        find(lib, pair.getter, getter);
        int32_t code = getter();
        if (code < 0 || code > 1024) throw std::runtime_error(std::string(pair.getter) + " gave " + std::to_string(code));
        if (shim.nccl_types.size() <= static_cast<size_t>(code)) shim.nccl_types.resize(static_cast<size_t>(code) + 1, {-1, 1});
        shim.nccl_types[static_cast<size_t>(code)] = {pair.nccl, pair.per_element};
    }
}

std::vector<std::string> register_ops(const std::string& cpu_library, const std::string& cuda_library) {
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
          "Register mpbind's C++ collective operators (mpbind::nccl_all_reduce, nccl_all_gather, nccl_reduce_scatter, "
          "nccl_all_to_all; CUDA kernels) with the PyTorch this process loaded from these libraries (libtorch_cpu and "
          "libtorch_cuda, '' when torch has no CUDA); returns their names. Once per process.");
    m.def("torch_ops_registered", [] { return torch_ops::registered; },
          "Whether torch_ops_register has registered the operators.");
}

}  // namespace mpbind
