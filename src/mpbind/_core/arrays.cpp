// Arrays and streams from Python objects, in one C++ pass per argument (see arrays.hpp), and the
// functions of mpbind._core that expose them to the layer's cold paths and to tests.

#include "arrays.hpp"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string_view>

#include "core.hpp"
#include "nccl.hpp"
#include "nvshmem.hpp"
#include "register.hpp"

namespace mpbind {

namespace arrays {

namespace {

// --- element types -----------------------------------------------------------------------------

constexpr DtypeInfo kInfo[] = {
    {"?", 0, 0, 0, -1, nullptr},
    {"bool", 6, 8, 1, -1, "|b1"},
    {"int8", 0, 8, 1, 0, "|i1"},
    {"int16", 0, 16, 2, -1, "<i2"},
    {"int32", 0, 32, 4, 2, "<i4"},
    {"int64", 0, 64, 8, 4, "<i8"},
    {"uint8", 1, 8, 1, 1, "|u1"},
    {"uint16", 1, 16, 2, -1, "<u2"},
    {"uint32", 1, 32, 4, 3, "<u4"},
    {"uint64", 1, 64, 8, 5, "<u8"},
    {"float16", 2, 16, 2, 6, "<f2"},
    {"bfloat16", 4, 16, 2, 9, nullptr},
    {"float32", 2, 32, 4, 7, "<f4"},
    {"float64", 2, 64, 8, 8, "<f8"},
    {"complex64", 5, 64, 8, -1, "<c8"},
    {"complex128", 5, 128, 16, -1, "<c16"},
    {"float8_e4m3fn", 10, 8, 1, 10, nullptr},
    {"float8_e5m2", 12, 8, 1, 11, nullptr},
};
constexpr size_t kDtypes = sizeof(kInfo) / sizeof(kInfo[0]);

struct Alias {
    const char* alias;
    Dtype dtype;
};
// Names frameworks use for our types (torch's "half", NumPy 1.x's "bool_", ...).
constexpr Alias kAliases[] = {
    {"half", Dtype::kFloat16},       {"float", Dtype::kFloat32},      {"double", Dtype::kFloat64},
    {"cfloat", Dtype::kComplex64},   {"cdouble", Dtype::kComplex128}, {"bf16", Dtype::kBFloat16},
    {"float8_e4m3", Dtype::kFloat8E4M3FN}, {"bool_", Dtype::kBool},
};

Dtype by_name(std::string_view name) {
    // Names as string_views, measured once (comparing against C strings would strlen each time).
    static const auto names = [] {
        std::array<std::string_view, kDtypes> out{};
        for (size_t i = 0; i < kDtypes; ++i) out[i] = kInfo[i].name;
        return out;
    }();
    if (name.substr(0, 6) == "torch.") name.remove_prefix(6);
    for (size_t i = 1; i < kDtypes; ++i) {
        if (name == names[i]) return static_cast<Dtype>(i);
    }
    for (const Alias& a : kAliases) {
        if (name == a.alias) return a.dtype;
    }
    return Dtype::kInvalid;
}

Dtype from_dlpack(uint8_t code, uint8_t bits, uint16_t lanes) {
    if (lanes != 1) return Dtype::kInvalid;
    for (size_t i = 1; i < kDtypes; ++i) {
        if (kInfo[i].dl_code == code && kInfo[i].dl_bits == bits) return static_cast<Dtype>(i);
    }
    return Dtype::kInvalid;
}

// A typestr of __cuda_array_interface__ ("<f4", "|b1"); kInvalid for what we do not take.
Dtype from_typestr(std::string_view ts) {
    if (ts.size() < 3 || ts.size() > 4) return Dtype::kInvalid;
    char order = ts[0];
    if (order != '<' && order != '|' && order != '=') return Dtype::kInvalid;  // big-endian data
    int bytes = ts[2] - '0';
    if (ts.size() == 4) bytes = bytes * 10 + (ts[3] - '0');
    switch (ts[1]) {
        case 'b': return bytes == 1 ? Dtype::kBool : Dtype::kInvalid;
        case 'i': return bytes == 1 ? Dtype::kInt8 : bytes == 2 ? Dtype::kInt16 : bytes == 4 ? Dtype::kInt32
                       : bytes == 8 ? Dtype::kInt64 : Dtype::kInvalid;
        case 'u': return bytes == 1 ? Dtype::kUInt8 : bytes == 2 ? Dtype::kUInt16 : bytes == 4 ? Dtype::kUInt32
                       : bytes == 8 ? Dtype::kUInt64 : Dtype::kInvalid;
        case 'f': return bytes == 2 ? Dtype::kFloat16 : bytes == 4 ? Dtype::kFloat32 : bytes == 8 ? Dtype::kFloat64
                       : Dtype::kInvalid;
        case 'c': return bytes == 8 ? Dtype::kComplex64 : bytes == 16 ? Dtype::kComplex128 : Dtype::kInvalid;
        default: return Dtype::kInvalid;
    }
}

std::string supported_names() {
    std::vector<std::string> names;
    for (size_t i = 1; i < kDtypes; ++i) names.emplace_back(kInfo[i].name);
    std::sort(names.begin(), names.end());
    std::string out;
    for (auto& n : names) out += (out.empty() ? "" : ", ") + n;
    return out;
}

// Objects seen before, by identity, with a strong reference so that an address is never reused
// under us: dtype objects, streams' types and arrays' types are few and live for the process.
template <class Value>
class IdentityCache {
public:
    // Room for every entry from the start: entries never move, so a reference find() returned
    // stays valid while Python code run meanwhile (a property, __dlpack__) adds others.
    IdentityCache() { entries_.reserve(kCapacity); }
    const Value* find(PyObject* key) const {
        for (const auto& e : entries_) {
            if (e.first == key) return &e.second;
        }
        return nullptr;
    }
    void add(PyObject* key, Value value) {
        if (entries_.size() >= kCapacity) return;  // an unusual program: keep working, uncached
        Py_INCREF(key);
        entries_.emplace_back(key, std::move(value));
    }

private:
    static constexpr size_t kCapacity = 64;
    std::vector<std::pair<PyObject*, Value>> entries_;
};

// Interned attribute names, made once (the GIL is held whenever they are used).
struct Names {
    PyObject* cai = PyUnicode_InternFromString("__cuda_array_interface__");
    PyObject* dlpack = PyUnicode_InternFromString("__dlpack__");
    PyObject* dlpack_device = PyUnicode_InternFromString("__dlpack_device__");
    PyObject* exchange = PyUnicode_InternFromString("__dlpack_c_exchange_api__");
    PyObject* max_version = PyUnicode_InternFromString("max_version");
    PyObject* shape = PyUnicode_InternFromString("shape");
    PyObject* strides = PyUnicode_InternFromString("strides");
    PyObject* typestr = PyUnicode_InternFromString("typestr");
    PyObject* mask = PyUnicode_InternFromString("mask");
    PyObject* data = PyUnicode_InternFromString("data");
    PyObject* dtype = PyUnicode_InternFromString("dtype");
    PyObject* device = PyUnicode_InternFromString("device");
    PyObject* device_id = PyUnicode_InternFromString("device_id");
    PyObject* index = PyUnicode_InternFromString("index");
    PyObject* id = PyUnicode_InternFromString("id");
    PyObject* ptr = PyUnicode_InternFromString("ptr");
    PyObject* name = PyUnicode_InternFromString("name");
    PyObject* data_ptr = PyUnicode_InternFromString("data_ptr");
    PyObject* get_device = PyUnicode_InternFromString("get_device");
    PyObject* stride = PyUnicode_InternFromString("stride");
    PyObject* cuda_stream_protocol = PyUnicode_InternFromString("__cuda_stream__");
    PyObject* cuda_stream = PyUnicode_InternFromString("cuda_stream");
    PyObject* version_tuple = Py_BuildValue("(ii)", 1, 3);  // the DLPack version we read
};
const Names& names() {
    static const Names* n = new Names();  // never freed: used until the process ends
    return *n;
}

// getattr(obj, name) that answers "absent" without raising AttributeError (which costs more than
// the lookup itself). Other exceptions propagate.
nb::object optional_attr(nb::handle obj, PyObject* name) {
    PyObject* out = nullptr;
#if PY_VERSION_HEX >= 0x030D0000
    int found = PyObject_GetOptionalAttr(obj.ptr(), name, &out);
#else
    int found = _PyObject_LookupAttr(obj.ptr(), name, &out);
#endif
    if (found < 0) throw nb::python_error();
    return nb::steal(out);  // null when absent
}

nb::object attr(nb::handle obj, PyObject* name) {
    PyObject* out = PyObject_GetAttr(obj.ptr(), name);
    if (out == nullptr) throw nb::python_error();
    return nb::steal(out);
}

nb::object call_method(nb::handle obj, PyObject* name) {
    PyObject* out = PyObject_CallMethodNoArgs(obj.ptr(), name);
    if (out == nullptr) throw nb::python_error();
    return nb::steal(out);
}

// The text of an exception for a message ("KeyError: 'x'"); never raises (its __str__ may).
std::string exception_text(const nb::python_error& err) {
    const char* type = reinterpret_cast<PyTypeObject*>(err.type().ptr())->tp_name;  // "module.Name": the name
    const char* dot = std::strrchr(type, '.');
    std::string out = dot ? dot + 1 : type;
    PyObject* text = PyObject_Str(err.value().ptr());
    if (text == nullptr) {
        PyErr_Clear();
        return out;
    }
    nb::object keep = nb::steal(text);
    const char* s = PyUnicode_AsUTF8(text);
    if (s == nullptr) {
        PyErr_Clear();
        return out;
    }
    return *s ? out + ": " + s : out;
}

// An int a producer gave (an extent, a stride, a count): TypeError naming it unless an int (or an
// object with __index__), OverflowError beyond 64 bits. KeyboardInterrupt and the like pass through.
long long to_long(nb::handle v, const char* what, const char* field) {
    if (PyBool_Check(v.ptr())) {  // an int to Python, but never an extent, stride or count
        raise_type(std::string(what) + ": " + field + " must be an int, not bool");
    }
    int overflow = 0;
    long long out = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (overflow != 0) {
        raise_overflow(std::string(what) + ": " + field + " value " + repr_of(v) + " does not fit in 64 bits");
    }
    if (out == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) throw nb::python_error();
        PyErr_Clear();
        raise_type(std::string(what) + ": " + field + " must be an int, not " + typename_of(v));
    }
    return out;
}

// An address (a pointer or a stream handle) from a Python int: false for negative or >= 2**64.
// Signed first: CPython's unsigned conversion takes a slower path for every value.
bool as_address(PyObject* v, uintptr_t& out) {
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow == 0) {
        if (x == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return false;
        }
        out = static_cast<uintptr_t>(x);
        return x >= 0;
    }
    if (overflow < 0) return false;
    unsigned long long u = PyLong_AsUnsignedLongLong(v);
    if (u == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
        PyErr_Clear();
        return false;
    }
    out = static_cast<uintptr_t>(u);
    return true;
}

// An int a producer gave (a device ordinal): TypeError naming it otherwise.
int int_field(nb::handle v, const char* what, const char* field) {
    if (!PyLong_Check(v.ptr())) {
        raise_type(std::string(what) + ": " + field + " must be an int, not " + typename_of(v));
    }
    long long x = to_long(v, what, field);
    if (x < INT32_MIN || x > INT32_MAX) {
        raise_usage(std::string(what) + ": " + field + " " + std::to_string(x) + " is out of range");
    }
    return static_cast<int>(x);
}

// A pointer a producer gave: UsageError naming it unless an address.
uintptr_t address_field(nb::handle v, const char* what, const char* field) {
    uintptr_t out = 0;
    if (!PyLong_Check(v.ptr()) || !as_address(v.ptr(), out)) {
        raise_usage(std::string(what) + ": " + field + " must be an address in [0, 2**64), got " + repr_of(v));
    }
    return out;
}

std::string hex(uint64_t v) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
    return buf;
}

std::string format_dims(const Dims& d) {
    std::string out = "(";
    for (size_t i = 0; i < d.size(); ++i) out += (i ? ", " : "") + std::to_string(d[i]);
    return out + (d.size() == 1 ? ",)" : ")");
}

// Compact row-major strides (in elements) of a shape validate() has bounded: no product overflows.
void set_c_strides(Array& a) {
    a.strides.resize_for_overwrite(a.shape.size());
    const int64_t* shape = a.shape.data();
    int64_t* strides = a.strides.data();
    int64_t acc = 1;
    for (size_t i = a.shape.size(); i-- > 0;) {
        strides[i] = acc;
        acc *= shape[i] > 0 ? shape[i] : 1;
    }
}

// The items of `seq`, a shape or strides, as a tuple of at most kMaxNdim items. A tuple is taken as
// it is; a list is copied (an item's __index__ could change the list while it is read); another
// sequence is iterated for at most kMaxNdim + 1 items, so that nothing a producer claims is
// allocated for before it is bounded. TypeError when not a sequence.
nb::object bounded_items(nb::handle seq, const char* what, const char* field) {
    PyObject* o = seq.ptr();
    auto too_many = [&](const std::string& n) {
        raise_usage(std::string(what) + ": its " + field + " has " + n + " entries; mpbind takes arrays of at most " +
                    std::to_string(kMaxNdim) + " dimensions");
    };
    if (PyTuple_Check(o)) {
        if (static_cast<size_t>(PyTuple_GET_SIZE(o)) > kMaxNdim) too_many(std::to_string(PyTuple_GET_SIZE(o)));
        return nb::borrow(seq);
    }
    if (PyList_Check(o)) {
        if (static_cast<size_t>(PyList_GET_SIZE(o)) > kMaxNdim) too_many(std::to_string(PyList_GET_SIZE(o)));
        nb::object t = nb::steal(PyList_AsTuple(o));
        if (!t.is_valid()) throw nb::python_error();
        return t;
    }
    if (!PySequence_Check(o) || PyUnicode_Check(o) || PyBytes_Check(o)) {
        raise_type(std::string(what) + ": its " + field + " must be a sequence of ints, not " + typename_of(seq));
    }
    nb::object it = nb::steal(PyObject_GetIter(o));
    if (!it.is_valid()) throw nb::python_error();
    std::array<nb::object, kMaxNdim> items;
    size_t n = 0;
    for (;;) {
        nb::object item = nb::steal(PyIter_Next(it.ptr()));
        if (!item.is_valid()) {
            if (PyErr_Occurred()) throw nb::python_error();
            break;
        }
        if (n == kMaxNdim) too_many("more than " + std::to_string(kMaxNdim));
        items[n++] = std::move(item);
    }
    nb::object t = nb::steal(PyTuple_New(static_cast<Py_ssize_t>(n)));
    if (!t.is_valid()) throw nb::python_error();
    for (size_t i = 0; i < n; ++i) PyTuple_SET_ITEM(t.ptr(), static_cast<Py_ssize_t>(i), items[i].release().ptr());
    return t;
}

// Shape from a sequence of ints (validate() checks the extents).
void read_shape(nb::handle seq, Array& a, const char* what) {
    nb::object items = bounded_items(seq, what, "shape");
    PyObject* t = items.ptr();
    size_t n = static_cast<size_t>(PyTuple_GET_SIZE(t));
    a.shape.resize_for_overwrite(n);
    for (size_t i = 0; i < n; ++i) a.shape[i] = to_long(PyTuple_GET_ITEM(t, static_cast<Py_ssize_t>(i)), what, "shape");
}

// Strides from a sequence of ints, each `unit` bytes per element step (1: already in elements), for
// an array whose shape is read.
void read_strides(nb::handle seq, Array& a, const char* what, int64_t unit) {
    nb::object items = bounded_items(seq, what, "strides");
    PyObject* t = items.ptr();
    size_t n = static_cast<size_t>(PyTuple_GET_SIZE(t));
    if (n != a.shape.size()) {
        raise_usage(std::string(what) + ": " + std::to_string(a.shape.size()) + " extents but " + std::to_string(n) +
                    " strides");
    }
    a.strides.resize_for_overwrite(n);
    for (size_t i = 0; i < n; ++i) {
        a.strides[i] = to_long(PyTuple_GET_ITEM(t, static_cast<Py_ssize_t>(i)), what, "strides");
    }
    for (size_t i = 0; i < n; ++i) {
        if (a.strides[i] % unit) {
            raise_usage(std::string(what) + ": array strides " + format_dims(a.strides) +
                        " are not multiples of its itemsize " + std::to_string(unit));
        }
    }
    for (size_t i = 0; i < n; ++i) a.strides[i] /= unit;
}

// --- the intake rules: every description passes them, whatever its source -------------------------
//
// A reader fills ptr, dtype, shape, device, readonly and source, and strides unless the array is C
// order (strides left empty); it bounds ndim before it reads or allocates for the extents.
// validate() then checks, in this order, with no allocation on success:
//   1. every extent >= 0 (UsageError);
//   2. the product of the nonzero extents, and that times the itemsize, fit in 2**63 - 1 (OverflowError):
//      size and nbytes() never overflow, nor do C strides;
//   3. unless the array is empty, the bytes its elements cover, from its lowest to its highest addressed
//      element given its strides, lie in [0, 2**64) from its pointer: each (extent - 1) x stride, their
//      sums and the byte offsets computed without overflow (UsageError otherwise);
//   4. a foreign array's device is a CUDA ordinal >= 0 or -1 (host) (UsageError);
// and sets size, the C strides when none were given, and contiguity.

[[noreturn]] void raise_span(const Array& a, const char* what) {
    raise_usage(std::string(what) + ": shape " + format_dims(a.shape) + " with strides " + format_dims(a.strides) +
                " elements of " + name(a.dtype) + " from address " + hex(a.ptr) +
                " reaches outside [0, 2**64)");
}

[[noreturn]] void raise_negative_extent(const Array& a, const char* what) {
    const int64_t* e = std::find_if(a.shape.data(), a.shape.data() + a.shape.size(), [](int64_t x) { return x < 0; });
    raise_usage(std::string(what) + ": negative extent " + std::to_string(*e) + " in its shape " + format_dims(a.shape));
}

// One pass over the extents (from the last) for an array with given strides and no zero extent: rule 3,
// and C contiguity (extents of 1 ignore their stride; every other stride is the product of the extents
// after it, which fits: it is at most the element count).
bool check_span(const Array& a, const char* what) {
    const int64_t* shape = a.shape.data();
    const int64_t* strides = a.strides.data();
    int64_t lo = 0, hi = 0, expected = 1;  // element offsets of the lowest and the highest element
    bool contiguous = true, bad = false;
    for (size_t i = a.shape.size(); i-- > 0;) {
        int64_t e = shape[i], reach = 0;
        contiguous &= e == 1 || strides[i] == expected;
        expected *= e;
        bad |= __builtin_mul_overflow(e - 1, strides[i], &reach);
        int64_t down = reach < 0 ? reach : 0;
        bad |= __builtin_add_overflow(lo, down, &lo) | __builtin_add_overflow(hi, reach - down, &hi);
    }
    int64_t below = 0, end = 0;  // bytes below ptr; bytes from ptr to the end of the highest element
    bad |= __builtin_mul_overflow(lo, a.itemsize(), &below) | __builtin_add_overflow(hi, int64_t{1}, &end);
    bad |= __builtin_mul_overflow(end, a.itemsize(), &end);
    uint64_t under = 0 - static_cast<uint64_t>(below);  // |below|, also for -2**63
    if (bad || a.ptr < under || static_cast<uint64_t>(end) > UINTPTR_MAX - a.ptr) raise_span(a, what);
    return contiguous;
}

void validate(Array& a, const char* what) {
    const size_t nd = a.shape.size();
    const int64_t* shape = a.shape.data();
    int64_t nonzero = 1, nbytes = 0;  // nonzero: the product of the nonzero extents
    bool empty = false, negative = false, overflow = false;
    for (size_t i = 0; i < nd; ++i) {
        int64_t e = shape[i];
        negative |= e < 0;
        empty |= e == 0;
        overflow |= __builtin_mul_overflow(nonzero, e == 0 ? 1 : e, &nonzero);
    }
    if (negative) raise_negative_extent(a, what);
    if (overflow || __builtin_mul_overflow(nonzero, a.itemsize(), &nbytes)) {
        raise_overflow(std::string(what) + ": shape " + format_dims(a.shape) + " of " + name(a.dtype) +
                       " holds more than 2**63 - 1 bytes");
    }
    a.size = empty ? 0 : nonzero;
    if (a.strides.size() != nd) {  // C order: the span is [ptr, ptr + nbytes)
        set_c_strides(a);
        if (!empty && static_cast<uint64_t>(nbytes) > UINTPTR_MAX - a.ptr) raise_span(a, what);
        a.contiguous = true;
    } else {
        a.contiguous = empty || check_span(a, what);  // an empty array addresses nothing, and is contiguous
    }
    if (a.device < -1 && a.source != Source::kTuple && a.source != Source::kBuffer) {
        raise_usage(std::string(what) + ": device " + std::to_string(a.device) + " is not a CUDA device ordinal");
    }
    if (a.ptr == 0 && a.size > 0) {
        raise_usage(std::string(what) + ": NULL data pointer for " + std::to_string(a.size) + " elements");
    }
}

// --- DLPack ------------------------------------------------------------------------------------

// The structures of dlpack.h (v1.x) that nanobind does not declare.
struct DLPackVersion {
    uint32_t major, minor;
};
struct ManagedTensor {
    nb::dlpack::dltensor dl_tensor;
    void* manager_ctx;
    void (*deleter)(ManagedTensor*);
};
struct ManagedTensorVersioned {
    DLPackVersion version;
    void* manager_ctx;
    void (*deleter)(ManagedTensorVersioned*);
    uint64_t flags;
    nb::dlpack::dltensor dl_tensor;
};
constexpr uint64_t kFlagReadOnly = 1;
constexpr uint64_t kFlagIsCopied = 2;
struct ExchangeApiHeader {
    DLPackVersion version;
    ExchangeApiHeader* prev_api;
};
struct ExchangeApi {
    ExchangeApiHeader header;
    int (*managed_tensor_allocator)(nb::dlpack::dltensor* prototype, ManagedTensorVersioned** out, void* error_ctx,
                                    void (*set_error)(void* error_ctx, const char* kind, const char* message));
    void* managed_tensor_from_py_object_no_sync;
    int (*managed_tensor_to_py_object_no_sync)(ManagedTensorVersioned* tensor, void** out_py_object);
    int (*dltensor_from_py_object_no_sync)(void* py_object, nb::dlpack::dltensor* out);
    int (*current_work_stream)(int32_t device_type, int32_t device_id, void** out_stream);
};
constexpr int32_t kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13;

void from_dltensor(const nb::dlpack::dltensor& t, uint64_t flags, Array& a, const char* what) {
    a.dtype = from_dlpack(t.dtype.code, t.dtype.bits, t.dtype.lanes);
    if (a.dtype == Dtype::kInvalid) {
        raise_usage(std::string(what) + ": unsupported DLPack dtype (code=" + std::to_string(t.dtype.code) +
                    ", bits=" + std::to_string(t.dtype.bits) + ", lanes=" + std::to_string(t.dtype.lanes) + ")");
    }
    // Bounded before anything is read or allocated for the extents.
    if (t.ndim < 0 || static_cast<size_t>(t.ndim) > kMaxNdim) {
        raise_usage(std::string(what) + ": DLPack tensor with ndim " + std::to_string(t.ndim) +
                    " (mpbind takes 0 to " + std::to_string(kMaxNdim) + " dimensions)");
    }
    if (t.ndim > 0 && t.shape == nullptr) {
        raise_usage(std::string(what) + ": DLPack tensor of ndim " + std::to_string(t.ndim) + " with a NULL shape");
    }
    uintptr_t data = reinterpret_cast<uintptr_t>(t.data);
    if (t.byte_offset > UINTPTR_MAX - data) {
        raise_usage(std::string(what) + ": DLPack data " + hex(data) + " + byte_offset " +
                    std::to_string(t.byte_offset) + " is past 2**64");
    }
    a.ptr = data + t.byte_offset;
    const auto nd = static_cast<size_t>(t.ndim);
    a.shape.resize_for_overwrite(nd);
    for (size_t i = 0; i < nd; ++i) a.shape[i] = t.shape[i];
    if (t.strides != nullptr) {  // NULL before DLPack 1.2: compact row-major (validate() sets them)
        a.strides.resize_for_overwrite(nd);
        for (size_t i = 0; i < nd; ++i) a.strides[i] = t.strides[i];
    }
    switch (t.device.device_type) {
        case kDLCUDA:
        case kDLCUDAManaged:
            if (t.device.device_id < 0) {  // -1 would read as the host
                raise_usage(std::string(what) + ": device " + std::to_string(t.device.device_id) +
                            " is not a CUDA device ordinal");
            }
            a.device = t.device.device_id;
            break;
        case kDLCPU:
        case kDLCUDAHost: a.device = -1; break;
        default:  // memory of another kind of device is neither a CUDA device's nor the host's
            raise_usage(std::string(what) + ": DLPack device type " + std::to_string(t.device.device_type) +
                        " is neither CUDA (2, 13) nor the host (1, 3)");
    }
    a.readonly = (flags & kFlagReadOnly) != 0;
}

// Producer errors (a tensor that cannot be exported) as UsageError naming the argument.
[[noreturn]] void raise_export_failed(nb::handle obj, const char* what, const char* how) {
    if (!PyErr_Occurred()) {  // a producer that failed without saying why
        raise_usage(std::string(what) + ": cannot import " + typename_of(obj) + " through " + how +
                    " (it reported a failure without an exception)");
    }
    nb::python_error err;  // takes the pending exception
    if (!err.matches(PyExc_Exception)) throw err;  // KeyboardInterrupt and the like pass through
    raise_usage(std::string(what) + ": cannot import " + typename_of(obj) + " through " + how + ": " +
                exception_text(err));
}

const ExchangeApi* exchange_api(PyTypeObject* type) {
    nb::object capsule = optional_attr(reinterpret_cast<PyObject*>(type), names().exchange);
    if (!capsule.is_valid()) return nullptr;
    if (!PyCapsule_IsValid(capsule.ptr(), "dlpack_exchange_api")) return nullptr;
    auto* header = static_cast<ExchangeApiHeader*>(PyCapsule_GetPointer(capsule.ptr(), "dlpack_exchange_api"));
    // A newer ABI first; a producer's chain is followed a bounded number of steps (it could loop).
    for (int steps = 0; header != nullptr && header->version.major > 1 && steps < 16; ++steps) {
        header = header->prev_api;
    }
    if (header == nullptr || header->version.major != 1) return nullptr;
    auto* api = reinterpret_cast<const ExchangeApi*>(header);
    return api->dltensor_from_py_object_no_sync != nullptr ? api : nullptr;
}

void via_exchange(nb::handle obj, const ExchangeApi* api, Array& a, const char* what) {
    nb::dlpack::dltensor t{};  // what a producer leaves unset reads as nothing usable, not as stack garbage
    if (api->dltensor_from_py_object_no_sync(obj.ptr(), &t) != 0) raise_export_failed(obj, what, "DLPack");
    from_dltensor(t, 0, a, what);  // the exchange has no read-only flag: frameworks with it write anywhere
    a.source = Source::kExchange;
}

void via_dlpack(nb::handle obj, Array& a, const char* what) {
    const Names& n = names();
    nb::object method = optional_attr(obj, n.dlpack);
    if (!method.is_valid()) {
        raise_type(std::string(what) + ": expected an array with __cuda_array_interface__ or __dlpack__, not " +
                   typename_of(obj));
    }
    // Ask for a versioned capsule (it carries the read-only flag); producers predating max_version
    // refuse the keyword with TypeError.
    PyObject* args[] = {n.version_tuple};
    nb::object kwnames = nb::steal(PyTuple_Pack(1, n.max_version));
    PyObject* capsule = PyObject_Vectorcall(method.ptr(), args, 0, kwnames.ptr());
    if (capsule == nullptr && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        capsule = PyObject_CallNoArgs(method.ptr());
    }
    if (capsule == nullptr) raise_export_failed(obj, what, "DLPack");
    nb::object keep = nb::steal(capsule);  // dropping it unconsumed runs the producer's deleter
    if (PyCapsule_IsValid(capsule, "dltensor_versioned")) {
        auto* mt = static_cast<ManagedTensorVersioned*>(PyCapsule_GetPointer(capsule, "dltensor_versioned"));
        if (mt->version.major != 1) {
            raise_usage(std::string(what) + ": DLPack version " + std::to_string(mt->version.major) +
                        " from " + typename_of(obj) + " (mpbind reads version 1)");
        }
        if (mt->flags & kFlagIsCopied) {
            // The copy would be freed with the capsule, before the library reads it.
            raise_usage(std::string(what) + ": " + typename_of(obj) + " exported a copy through DLPack; "
                        "pass an array that views its memory");
        }
        from_dltensor(mt->dl_tensor, mt->flags, a, what);
    } else if (PyCapsule_IsValid(capsule, "dltensor")) {
        auto* mt = static_cast<ManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
        from_dltensor(mt->dl_tensor, 0, a, what);
    } else {
        raise_type(std::string(what) + ": " + typename_of(obj) + ".__dlpack__() returned no DLPack capsule");
    }
    a.source = Source::kDlpack;
}

// --- __cuda_array_interface__ ----------------------------------------------------------------

// The device of an array that describes itself through the interface (which names none):
// .device.index (PyTorch), .device.id (CuPy, JAX), __dlpack_device__(), else device 0.
int interface_device(nb::handle obj) {
    const Names& n = names();
    try {
        nb::object dev = optional_attr(obj, n.device);
        if (dev.is_valid() && !dev.is_none()) {
            for (PyObject* field : {n.index, n.id}) {
                nb::object v = optional_attr(dev, field);
                if (v.is_valid() && PyLong_Check(v.ptr()) && !PyBool_Check(v.ptr())) return nb::cast<int>(v);
            }
        }
        nb::object method = optional_attr(obj, n.dlpack_device);
        if (method.is_valid()) {
            nb::object r = nb::steal(PyObject_CallNoArgs(method.ptr()));
            if (r.is_valid() && PyTuple_Check(r.ptr()) && PyTuple_GET_SIZE(r.ptr()) == 2) {
                int kind = nb::cast<int>(nb::handle(PyTuple_GET_ITEM(r.ptr(), 0)));
                if (kind == kDLCUDA || kind == kDLCUDAManaged) {
                    return nb::cast<int>(nb::handle(PyTuple_GET_ITEM(r.ptr(), 1)));
                }
            }
            PyErr_Clear();
        }
    } catch (nb::python_error& e) {
        // A device query must not mask the array itself.
        if (!e.matches(PyExc_Exception)) throw;
    } catch (nb::cast_error&) {
    }
    return 0;
}

// Reads `cai` into `a`; false when its typestr names no element type and DLPack can ("<V2": bfloat16).
bool from_interface(nb::handle obj, nb::handle cai, Array& a, const char* what) {
    const Names& n = names();
    if (!PyDict_Check(cai.ptr())) {
        raise_type(std::string(what) + ": __cuda_array_interface__ must be a dict, not " + typename_of(cai));
    }
    PyObject* typestr = PyDict_GetItemWithError(cai.ptr(), n.typestr);
    PyObject* shape = PyDict_GetItemWithError(cai.ptr(), n.shape);
    PyObject* data = PyDict_GetItemWithError(cai.ptr(), n.data);
    if (PyErr_Occurred()) throw nb::python_error();
    if (typestr == nullptr || shape == nullptr || data == nullptr || !PyUnicode_Check(typestr)) {
        raise_type(std::string(what) + ": __cuda_array_interface__ needs 'shape', 'typestr' and 'data'");
    }
    Py_ssize_t len = 0;
    const char* ts = PyUnicode_AsUTF8AndSize(typestr, &len);
    if (ts == nullptr) throw nb::python_error();
    std::string_view tsv(ts, static_cast<size_t>(len));
    if (tsv.size() >= 2 && tsv[1] == 'V' && optional_attr(obj, names().dlpack).is_valid()) return false;
    a.dtype = from_typestr(tsv);
    if (a.dtype == Dtype::kInvalid) {
        raise_usage(std::string(what) + ": unsupported __cuda_array_interface__ typestr '" + std::string(tsv) +
                    "' (supported: " + supported_names() + ")");
    }
    PyObject* mask = PyDict_GetItemWithError(cai.ptr(), n.mask);
    if (mask == nullptr && PyErr_Occurred()) throw nb::python_error();
    if (mask != nullptr && mask != Py_None) {  // a masked array's elements are not all valid data
        raise_usage(std::string(what) + ": __cuda_array_interface__ with a mask (masked arrays are not supported)");
    }
    read_shape(shape, a, what);
    if (!PyTuple_Check(data) || PyTuple_GET_SIZE(data) != 2) {
        raise_type(std::string(what) + ": __cuda_array_interface__['data'] must be (ptr, readonly)");
    }
    if (!PyLong_Check(PyTuple_GET_ITEM(data, 0)) || !as_address(PyTuple_GET_ITEM(data, 0), a.ptr)) {
        raise_usage(std::string(what) + ": __cuda_array_interface__['data'][0] must be an address >= 0");
    }
    int ro = PyObject_IsTrue(PyTuple_GET_ITEM(data, 1));
    if (ro < 0) {
        nb::python_error err;
        if (!err.matches(PyExc_Exception)) throw err;
        raise_usage(std::string(what) + ": __cuda_array_interface__['data'][1] (read-only) is not a truth value: " +
                    exception_text(err));
    }
    a.readonly = ro != 0;
    PyObject* strides = PyDict_GetItemWithError(cai.ptr(), n.strides);
    if (strides == nullptr && PyErr_Occurred()) throw nb::python_error();
    if (strides != nullptr && strides != Py_None) read_strides(strides, a, what, a.itemsize());  // else C order
    a.device = (a.ptr == 0 && a.shape.size() == 0) ? -1 : interface_device(obj);
    a.source = Source::kInterface;
    return true;
}

void via_interface(nb::handle obj, Array& a, const char* what) {
    const Names& n = names();
    PyObject* cai = nullptr;
#if PY_VERSION_HEX >= 0x030D0000
    int found = PyObject_GetOptionalAttr(obj.ptr(), n.cai, &cai);
#else
    int found = _PyObject_LookupAttr(obj.ptr(), n.cai, &cai);
#endif
    nb::object keep = nb::steal(cai);
    if (found < 0) {
        // The interface raised: float8 tensors (no typestr), JAX's unimplemented types, CPU
        // tensors of some frameworks. DLPack may still describe it.
        if (!PyErr_ExceptionMatches(PyExc_Exception)) throw nb::python_error();
        nb::python_error err;
        if (!nb::hasattr(obj, "__dlpack__")) {
            err.restore();
            raise_export_failed(obj, what, "__cuda_array_interface__");
        }
        via_dlpack(obj, a, what);
        return;
    }
    if (found == 0) {
        via_dlpack(obj, a, what);  // TypeError naming both protocols when it has neither
        return;
    }
    if (!from_interface(obj, keep, a, what)) via_dlpack(obj, a, what);
}

// --- PyTorch and CuPy through their attributes ---------------------------------------------------

IdentityCache<Dtype>& dtype_cache() {
    static auto* c = new IdentityCache<Dtype>();
    return *c;
}

Dtype dtype_attr(nb::handle obj, const char* what) {
    nb::object dt = attr(obj, names().dtype);
    if (const Dtype* d = dtype_cache().find(dt.ptr())) return *d;
    try {
        return dtype_of(dt);
    } catch (nb::python_error& e) {
        if (!e.matches(PyExc_ValueError)) throw;
        raise_usage(std::string(what) + ": " + std::string(nb::str(e.value()).c_str()));
    }
}

void via_torch(nb::handle obj, Array& a, const char* what) {
    const Names& n = names();
    a.dtype = dtype_attr(obj, what);
    read_shape(attr(obj, n.shape), a, what);
    read_strides(call_method(obj, n.stride), a, what, 1);
    a.ptr = address_field(call_method(obj, n.data_ptr), what, "data_ptr()");
    a.device = int_field(call_method(obj, n.get_device), what, "get_device()");  // -1 on the CPU
    a.source = Source::kTorch;
}

void via_cupy(nb::handle obj, Array& a, const char* what) {
    const Names& n = names();
    a.dtype = dtype_attr(obj, what);
    read_shape(attr(obj, n.shape), a, what);
    read_strides(attr(obj, n.strides), a, what, a.itemsize());
    nb::object memptr = attr(obj, n.data);
    a.ptr = address_field(attr(memptr, n.ptr), what, "data.ptr");
    a.device = int_field(attr(memptr, n.device_id), what, "data.device_id");
    a.source = Source::kCupy;
}

// --- our own arrays ----------------------------------------------------------------------------
//
// mpbind.nvshmem.SymmetricArray and PeerArray are the core's own types (nvshmem.cpp): recognised by
// their C++ type, each holding the description made (and put through the intake rules) when it was
// made. nvshmem::describe_symmetric / describe_peer copy it and fill in the address.

void via_buffer(nb::handle obj, Array& a) {
    nccl::BufferSpan b = nccl::buffer_of(obj);  // UsageError once freed
    a.ptr = b.ptr;
    a.dtype = Dtype::kUInt8;
    a.shape.resize_for_overwrite(1);
    a.shape[0] = static_cast<int64_t>(b.nbytes);
    a.device = b.device;
    a.source = Source::kBuffer;
}

void via_tuple(nb::handle obj, Array& a, const char* what) {
    if (PyTuple_GET_SIZE(obj.ptr()) != 3) {
        raise_type(std::string(what) + " given as a tuple must be (ptr, count, dtype)");
    }
    PyObject* ptr = PyTuple_GET_ITEM(obj.ptr(), 0);
    PyObject* count = PyTuple_GET_ITEM(obj.ptr(), 1);
    if (!PyLong_Check(ptr) || !PyLong_Check(count)) raise_type(std::string(what) + ": ptr and count must be ints");
    uintptr_t p = 0;
    if (!as_address(ptr, p)) {
        raise_usage(std::string(what) + ": ptr must be an address in [0, 2**64), got " + repr_of(ptr));
    }
    long long c = to_long(count, what, "count");
    if (c < 0) raise_usage(std::string(what) + ": count must be >= 0, got " + std::to_string(c));
    a.dtype = dtype_of(PyTuple_GET_ITEM(obj.ptr(), 2));
    a.ptr = p;
    a.shape.resize_for_overwrite(1);
    a.shape[0] = c;
    a.device = -2;  // taken on trust
    a.source = Source::kTuple;
}

// --- the per-type choice -------------------------------------------------------------------------

struct Path {
    Source source;
    const ExchangeApi* exchange = nullptr;
};

bool mro_has(PyTypeObject* type, std::initializer_list<const char*> tp_names) {
    PyObject* mro = type->tp_mro;
    if (mro == nullptr) return false;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro); ++i) {
        const char* n = reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(mro, i))->tp_name;
        for (const char* want : tp_names) {
            if (std::strcmp(n, want) == 0) return true;
        }
    }
    return false;
}

bool is_class(PyTypeObject* type, const char* module, const char* qualname) {
    PyObject* dict = type->tp_dict;
    if (dict == nullptr) return false;
    PyObject* mod = PyDict_GetItemString(dict, "__module__");  // borrowed
    if (mod == nullptr || !PyUnicode_Check(mod) || PyUnicode_CompareWithASCIIString(mod, module) != 0) return false;
    nb::object qn = nb::steal(PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), "__qualname__"));
    if (!qn.is_valid()) {
        PyErr_Clear();
        return false;
    }
    return PyUnicode_Check(qn.ptr()) && PyUnicode_CompareWithASCIIString(qn.ptr(), qualname) == 0;
}

// Whether module.qualname is `type` or one of its bases. For classes defined in Python (heap types,
// also when Cython compiles them) tp_name is the bare name, which mro_has cannot tell apart.
bool mro_has_class(PyTypeObject* type, const char* module, const char* qualname) {
    PyObject* mro = type->tp_mro;
    if (mro == nullptr) return false;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro); ++i) {
        if (is_class(reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(mro, i)), module, qualname)) return true;
    }
    return false;
}

Path classify(PyTypeObject* type) {
    Path p{Source::kInterface};
    if (PyType_IsSubtype(type, &PyTuple_Type)) {
        p.source = Source::kTuple;
    } else if (nvshmem::is_symmetric_array(type)) {
        p.source = Source::kSymmetric;
    } else if (nvshmem::is_peer_array(type)) {
        p.source = Source::kPeer;
    } else if (nccl::buffer_type().is(reinterpret_cast<PyObject*>(type))) {
        p.source = Source::kBuffer;
    } else if (const ExchangeApi* api = exchange_api(type)) {
        p.source = Source::kExchange;
        p.exchange = api;
    } else if (mro_has(type, {"torch._C.TensorBase", "torch._C._TensorBase"})) {
        p.source = Source::kTorch;
    } else if (mro_has(type, {"cupy._core.core._ndarray_base", "cupy._core.core.ndarray"})) {
        p.source = Source::kCupy;
    }
    return p;
}

IdentityCache<Path>& path_cache() {
    static auto* c = new IdentityCache<Path>();
    return *c;
}

const Path& path_of(PyTypeObject* type, Path& scratch) {
    auto& cache = path_cache();
    if (const Path* p = cache.find(reinterpret_cast<PyObject*>(type))) return *p;
    scratch = classify(type);
    cache.add(reinterpret_cast<PyObject*>(type), scratch);
    return scratch;
}

// The reader of `p`, then the intake rules (validate()) on what it read.
void run(nb::handle obj, const Path& p, Array& a, const char* what) {
    switch (p.source) {
        case Source::kTuple: via_tuple(obj, a, what); break;
        case Source::kSymmetric: nvshmem::describe_symmetric(obj, a, what); return;  // validated when made
        case Source::kPeer: nvshmem::describe_peer(obj, a, what); return;            // validated when made
        case Source::kBuffer: via_buffer(obj, a); break;
        case Source::kExchange: via_exchange(obj, p.exchange, a, what); break;
        case Source::kTorch: via_torch(obj, a, what); break;
        case Source::kCupy: via_cupy(obj, a, what); break;
        case Source::kInterface: via_interface(obj, a, what); break;
        case Source::kDlpack: via_dlpack(obj, a, what); break;
    }
    validate(a, what);
}

}  // namespace

// --- public --------------------------------------------------------------------------------------

const DtypeInfo& info(Dtype d) { return kInfo[static_cast<size_t>(d)]; }

Dtype dtype_of(nb::handle dtype) {
    auto& cache = dtype_cache();  // by identity: the same name object, dtype object or type again
    if (const Dtype* d = cache.find(dtype.ptr())) return *d;
    if (PyUnicode_Check(dtype.ptr())) {
        Py_ssize_t len = 0;
        const char* s = PyUnicode_AsUTF8AndSize(dtype.ptr(), &len);
        if (s == nullptr) PyErr_Clear();  // lone surrogates: no name of ours
        Dtype d = s ? by_name(std::string_view(s, static_cast<size_t>(len))) : Dtype::kInvalid;
        if (d == Dtype::kInvalid) {
            raise_usage("unsupported dtype " + repr_of(dtype) + " (supported: " + supported_names() + ")");
        }
        if (PyUnicode_CHECK_INTERNED(dtype.ptr())) cache.add(dtype.ptr(), d);  // literals: kept anyway
        return d;
    }
    std::string name;
    PyObject* modules = PyImport_GetModuleDict();  // borrowed
    PyObject* numpy = PyDict_GetItemString(modules, "numpy");
    bool is_type = PyType_Check(dtype.ptr());
    if (numpy != nullptr && (is_type || std::strncmp(Py_TYPE(dtype.ptr())->tp_name, "numpy", 5) == 0)) {
        // NumPy's own answer for its dtypes and for types (float -> float64, np.intc, ml_dtypes)
        try {
            name = nb::cast<std::string>(nb::borrow(numpy).attr("dtype")(dtype).attr("name"));
        } catch (nb::python_error& e) {
            if (!e.matches(PyExc_Exception)) throw;
        }
    }
    // Other objects name themselves through Python code (a property, __str__), which may raise: an
    // object that cannot say its name is not a dtype (KeyboardInterrupt and the like pass through).
    try {
        if (name.empty() && is_type) {
            auto* t = reinterpret_cast<PyTypeObject*>(dtype.ptr());
            name = t == &PyFloat_Type ? "float64" : t == &PyLong_Type ? "int64" : t == &PyComplex_Type ? "complex128"
                   : t == &PyBool_Type ? "bool" : nb::cast<std::string>(nb::str(dtype.attr("__name__")));
        }
        if (name.empty()) {
            nb::object str_name = optional_attr(dtype, names().name);  // dtype objects of other array libraries
            if (str_name.is_valid() && PyUnicode_Check(str_name.ptr())) {
                name = nb::cast<std::string>(str_name);
            } else {
                std::string s = nb::cast<std::string>(nb::str(dtype));  // torch.float32, jnp dtypes
                name = s.substr(s.rfind('.') + 1);
            }
        }
    } catch (nb::python_error& e) {
        if (!e.matches(PyExc_Exception)) throw;
        raise_usage("unsupported dtype: a " + typename_of(dtype) + " that cannot give its name (" +
                    exception_text(e) + "; supported: " + supported_names() + ")");
    } catch (nb::cast_error&) {
        raise_usage("unsupported dtype: a " + typename_of(dtype) + " whose name is not text (supported: " +
                    supported_names() + ")");
    }
    Dtype d = by_name(name);
    if (d == Dtype::kInvalid) {
        raise_usage("unsupported dtype " + repr_of(dtype) + " (supported: " + supported_names() + ")");
    }
    cache.add(dtype.ptr(), d);
    return d;
}

const char* source_name(Source s) {
    switch (s) {
        case Source::kTuple: return "tuple";
        case Source::kSymmetric: return "symmetric";
        case Source::kPeer: return "peer";
        case Source::kBuffer: return "buffer";
        case Source::kExchange: return "exchange";
        case Source::kTorch: return "torch";
        case Source::kCupy: return "cupy";
        case Source::kInterface: return "interface";
        case Source::kDlpack: return "dlpack";
    }
    return "?";
}

void Dims::resize_for_overwrite(size_t n) {
    if (n > kInline) heap_.resize(n);
    n_ = n;
}

Array describe(nb::handle obj, const char* what, bool tuples) {
    Array a;
    Path scratch;
    const Path& p = path_of(Py_TYPE(obj.ptr()), scratch);  // cache entries never move
    if (p.source == Source::kTuple && !tuples) {
        raise_type(std::string(what) + ": expected an array with __cuda_array_interface__ or __dlpack__, not a tuple");
    }
    run(obj, p, a, what);
    return a;
}

Array describe_c_order(uintptr_t ptr, nb::handle shape, nb::handle dtype, int device, Source source,
                       const char* what) {
    Array a;
    read_shape(shape, a, what);
    a.dtype = dtype_of(dtype);
    a.device = device;
    a.ptr = ptr;
    a.source = source;
    validate(a, what);
    return a;
}

Array describe_via(nb::handle obj, const char* what, Source source) {
    Array a;
    Path scratch;
    Path p = path_of(Py_TYPE(obj.ptr()), scratch);  // the type's cached facts, another path
    if (source == Source::kExchange && p.exchange == nullptr) {
        raise_usage(typename_of(obj) + " has no DLPack C exchange API");
    }
    bool ours = source == Source::kTuple || source == Source::kSymmetric || source == Source::kPeer ||
                source == Source::kBuffer;
    if (ours && p.source != source) raise_usage(typename_of(obj) + " is not read as " + source_name(source));
    p.source = source;
    run(obj, p, a, what);
    return a;
}

Producer Producer::of(nb::handle obj) {
    Path scratch;
    const ExchangeApi* api = path_of(Py_TYPE(obj.ptr()), scratch).exchange;
    Producer p;
    if (api && api->managed_tensor_allocator && api->managed_tensor_to_py_object_no_sync && api->current_work_stream) {
        p.api_ = api;
    }
    return p;
}

nb::object Producer::empty(const Dims& shape, Dtype dtype, int device, uintptr_t& ptr, const char* what) const {
    const auto* api = static_cast<const ExchangeApi*>(api_);
    const DtypeInfo& d = info(dtype);
    nb::dlpack::dltensor proto{};  // the allocator reads only the dtype, ndim, shape and device
    proto.device = {kDLCUDA, device};
    proto.ndim = static_cast<int32_t>(shape.size());
    proto.dtype = {d.dl_code, d.dl_bits, 1};
    proto.shape = const_cast<int64_t*>(shape.data());
    std::string failure;
    ManagedTensorVersioned* mt = nullptr;
    int rc = api->managed_tensor_allocator(&proto, &mt, &failure, [](void* ctx, const char* kind, const char* message) {
        *static_cast<std::string*>(ctx) = std::string(kind ? kind : "") + ": " + (message ? message : "");
    });
    if (rc != 0 || mt == nullptr) {
        PyErr_Clear();  // the allocator reports through SetError; nothing of it stays pending
        raise_mpbind(std::string(what) + ": the output's allocation (" + format_dims(shape) + ", " + d.name +
                     ") failed" + (failure.empty() ? "" : " (" + failure + ")"));
    }
    // What came back is checked before it is written to: extents, dtype, device, compact layout.
    const nb::dlpack::dltensor& t = mt->dl_tensor;
    bool same = t.ndim == proto.ndim && t.device.device_type == kDLCUDA && t.device.device_id == device &&
                t.dtype.code == proto.dtype.code && t.dtype.bits == proto.dtype.bits && t.dtype.lanes == 1 &&
                (t.ndim == 0 || t.shape != nullptr);
    bool empty = false;
    int64_t stride = 1;  // the requested extents': their product is known to fit
    for (int32_t i = t.ndim; same && i-- > 0;) {
        int64_t n = shape[static_cast<size_t>(i)];
        same = t.shape[i] == n && (t.strides == nullptr || n < 2 || t.strides[i] == stride);
        stride *= n > 0 ? n : 1;
        empty = empty || n == 0;
    }
    if (!same || (t.data == nullptr && !empty)) {
        if (mt->deleter) mt->deleter(mt);
        raise_mpbind(std::string(what) + ": the framework's allocator returned another tensor than the C-contiguous " +
                     format_dims(shape) + " " + d.name + " on device " + std::to_string(device) + " asked for");
    }
    ptr = reinterpret_cast<uintptr_t>(t.data) + t.byte_offset;
    void* obj = nullptr;
    if (api->managed_tensor_to_py_object_no_sync(mt, &obj) != 0 || obj == nullptr) {  // it owns mt either way
        if (PyErr_Occurred()) throw nb::python_error();
        raise_mpbind(std::string(what) + ": the framework could not make a tensor of its allocation");
    }
    return nb::steal(static_cast<PyObject*>(obj));
}

uintptr_t Producer::stream(int device, const char* what) const {
    void* s = nullptr;
    if (static_cast<const ExchangeApi*>(api_)->current_work_stream(kDLCUDA, device, &s) != 0) {
        if (PyErr_Occurred()) throw nb::python_error();
        raise_mpbind(std::string(what) + ": the framework gave no current stream for device " + std::to_string(device));
    }
    return reinterpret_cast<uintptr_t>(s);
}

Array device_array(nb::handle obj, const Want& want) {
    Array a = describe(obj, want.what, want.tuples);
    if (a.device == -1) raise_usage(std::string(want.what) + " must be in GPU memory (got a host array)");
    if (want.dtype != Dtype::kInvalid && a.dtype != want.dtype) {
        raise_usage(std::string(want.what) + " has dtype " + name(a.dtype) + ", expected " + name(want.dtype));
    }
    if (want.contiguous && !a.contiguous) {
        raise_usage(std::string(want.what) + " must be C-contiguous (shape " + format_dims(a.shape) + ", strides " +
                    format_dims(a.strides) + " elements)");
    }
    if (want.writable && a.readonly) raise_usage(std::string(want.what) + " is read-only");
    return a;
}

void check_export(uintptr_t ptr, const std::vector<size_t>& shape, uint8_t code, uint8_t bits, int device,
                  const char* what) {
    Array a;
    a.dtype = from_dlpack(code, bits, 1);
    if (a.dtype == Dtype::kInvalid) {
        raise_usage(std::string(what) + ": unsupported DLPack dtype (code=" + std::to_string(code) + ", bits=" +
                    std::to_string(bits) + ")");
    }
    if (shape.size() > kMaxNdim) {
        raise_usage(std::string(what) + ": " + std::to_string(shape.size()) + " dimensions; mpbind takes arrays of at "
                    "most " + std::to_string(kMaxNdim));
    }
    a.shape.resize_for_overwrite(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) {
        if (shape[i] > static_cast<size_t>(INT64_MAX)) {
            raise_overflow(std::string(what) + ": extent " + std::to_string(shape[i]) + " does not fit in 2**63 - 1");
        }
        a.shape[i] = static_cast<int64_t>(shape[i]);
    }
    if (device < 0) {  // exported as CUDA memory: a host ordinal (-1) would be a lie
        raise_usage(std::string(what) + ": device " + std::to_string(device) + " is not a CUDA device ordinal");
    }
    a.ptr = ptr;
    a.device = device;
    a.source = Source::kInterface;
    validate(a, what);
}

std::string repr_of(nb::handle obj) {
    PyObject* r = PyObject_Repr(obj.ptr());
    if (r == nullptr) {
        PyErr_Clear();
        return "<" + typename_of(obj) + ">";
    }
    nb::object keep = nb::steal(r);
    const char* s = PyUnicode_AsUTF8(r);
    if (s == nullptr) {
        PyErr_Clear();
        return "<" + typename_of(obj) + ">";
    }
    return s;
}

std::string typename_of(nb::handle obj) {
    const char* n = Py_TYPE(obj.ptr())->tp_name;  // "module.Name" for C types: keep the name
    const char* dot = std::strrchr(n, '.');
    return dot ? dot + 1 : n;
}

bool as_index(nb::handle obj, long long& out) {
    PyObject* o = obj.ptr();
    if (PyBool_Check(o)) return false;
    nb::object index;
    if (!PyLong_Check(o)) {
        if (!PyIndex_Check(o) || std::strncmp(Py_TYPE(o)->tp_name, "numpy.bool", 10) == 0) return false;
        index = nb::steal(PyNumber_Index(o));
        if (!index.is_valid()) {
            PyErr_Clear();
            return false;
        }
        o = index.ptr();
    }
    out = PyLong_AsLongLong(o);
    if (out == -1 && PyErr_Occurred()) throw nb::python_error();  // OverflowError
    return true;
}

}  // namespace arrays

// --- streams -----------------------------------------------------------------------------------

namespace {

enum class StreamVia : uint8_t { kProtocol, kCudaStream, kPtr, kNone };

StreamVia stream_via(PyTypeObject* type) {
    static auto* cache = new arrays::IdentityCache<StreamVia>();
    if (const StreamVia* v = cache->find(reinterpret_cast<PyObject*>(type))) return *v;
    const auto& n = arrays::names();
    auto has = [&](PyObject* name) { return _PyType_Lookup(type, name) != nullptr; };
    StreamVia via = StreamVia::kNone;
    // PyTorch's __cuda_stream__ is Python code around its C attribute cuda_stream: read that.
    if (has(n.cuda_stream) && arrays::mro_has(type, {"torch._C._CudaStreamBase"})) {
        via = StreamVia::kCudaStream;
    } else if (arrays::mro_has(type, {"cupy.cuda.stream._BaseStream"}) ||
               arrays::mro_has_class(type, "cupy.cuda.stream", "_BaseStream")) {
        // CuPy's __cuda_stream__ is a Python method returning a tuple; its .ptr (a C property of a
        // C class, or since CuPy 14 an attribute of the instance of a Python class) is the same
        // handle at a fraction of the cost: 0.25-0.3 µs less per call on the hot path.
        via = StreamVia::kPtr;
    } else if (has(n.cuda_stream_protocol)) {
        via = StreamVia::kProtocol;
    } else if (has(n.cuda_stream)) {
        via = StreamVia::kCudaStream;
    } else if (has(n.ptr)) {
        via = StreamVia::kPtr;
    }
    if (via != StreamVia::kNone) cache->add(reinterpret_cast<PyObject*>(type), via);
    return via;
}

// --- a raw handle, checked before a library dereferences it ---
//
// A cudaStream_t other than 0 (the legacy default stream), 1 (cudaStreamLegacy) and 2
// (cudaStreamPerThread) is the address of the driver's stream object, which the libraries (and the
// driver) dereference without a check: a made-up int there is a segfault. The driver cannot be asked
// whether a handle is one of its streams: cuStreamGetId, cuStreamQuery, cuStreamGetCtx and
// cuStreamGetFlags all dereference it and crash on a handle that points nowhere (seen with driver
// 580 / CUDA 13.0 on an H200, for 2**31, 2**40, 2**63-1, 2**63, 3, 4 and a destroyed stream; only
// (CUstream)-1 was answered, with CUDA_ERROR_INVALID_HANDLE). So the core checks what it can
// without dereferencing: the handle is pointer-aligned (the stream object holds pointers) and this
// process can read memory there (process_vm_readv of its own memory fails with EFAULT where a read
// would fault). That refuses every handle that points nowhere; one that points at readable memory
// that is no stream (a destroyed stream, another object) passes, as any raw pointer would.

constexpr uintptr_t kLastSpecialStream = 2;  // cudaStreamPerThread

bool readable(uintptr_t h) {
    alignas(8) unsigned char buf[8];
    iovec local{buf, sizeof buf}, remote{reinterpret_cast<void*>(h), sizeof buf};
    // 8 aligned bytes never cross a page: the read is whole or fails.
    ssize_t n = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
    if (n == static_cast<ssize_t>(sizeof buf)) return true;
    if (n < 0 && errno != EFAULT && errno != ENOMEM) {
        // The call is unavailable (ENOSYS, or EPERM under a seccomp filter): whether the page is
        // mapped at all (a PROT_NONE page passes; the common made-up values are unmapped).
        const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
        unsigned char resident = 0;
        return mincore(reinterpret_cast<void*>(h & ~(page - 1)), 1, &resident) == 0;
    }
    return false;
}

// Handles that passed, per thread: a loop on one stream (or a few) pays the system call once.
struct CheckedStreams {
    std::array<uintptr_t, 4> seen{};
    unsigned next = 0;
    bool has(uintptr_t h) const { return std::find(seen.begin(), seen.end(), h) != seen.end(); }
    void add(uintptr_t h) { seen[next++ % seen.size()] = h; }
};
thread_local CheckedStreams checked_streams;

void check_stream_handle(uintptr_t h, const char* from) {
    if (h <= kLastSpecialStream || checked_streams.has(h)) return;
    if (h % alignof(void*) != 0 || !readable(h)) {
        raise_usage(std::string("stream: ") + from + " is " + arrays::hex(h) +
                    ", which is no CUDA stream: no readable, pointer-aligned memory at that address (a "
                    "cudaStream_t is 0, 1 (cudaStreamLegacy), 2 (cudaStreamPerThread) or a stream that CUDA made)");
    }
    checked_streams.add(h);
}

uintptr_t stream_value(nb::handle v, const char* from) {
    if (!PyLong_Check(v.ptr()) || PyBool_Check(v.ptr())) {
        raise_type(std::string("stream: ") + from + " must be an int, not " + arrays::typename_of(v));
    }
    uintptr_t h = 0;
    if (!arrays::as_address(v.ptr(), h)) {
        raise_usage(std::string("stream: ") + from + " must be a cudaStream_t in [0, 2**64), got " +
                    arrays::repr_of(v));
    }
    check_stream_handle(h, from);
    return h;
}

// A stream object whose protocol raised (a property, __cuda_stream__()): UsageError naming `stream`
// and what raised. KeyboardInterrupt and the like pass through.
[[noreturn]] void raise_stream_failed(nb::handle obj, const char* how) {
    nb::python_error err;  // takes the pending exception
    if (!err.matches(PyExc_Exception)) throw err;
    raise_usage(std::string("stream: ") + how + " of " + arrays::typename_of(obj) + " raised " +
                arrays::exception_text(err));
}

// getattr(obj, name), its failure reported as the stream's.
nb::object stream_attr(nb::handle obj, PyObject* name, const char* how) {
    PyObject* out = PyObject_GetAttr(obj.ptr(), name);
    if (out == nullptr) raise_stream_failed(obj, how);
    return nb::steal(out);
}

// The handle __cuda_stream__() gives: (version 0, cudaStream_t), the CUDA stream protocol.
uintptr_t stream_protocol(nb::handle obj, nb::handle method) {
    nb::object info = nb::steal(PyObject_CallNoArgs(method.ptr()));
    if (!info.is_valid()) raise_stream_failed(obj, "__cuda_stream__()");
    if (!PyTuple_Check(info.ptr()) || PyTuple_GET_SIZE(info.ptr()) != 2) {
        raise_type("stream: __cuda_stream__() of " + arrays::typename_of(obj) +
                   " must return a (version, handle) tuple, not " + arrays::repr_of(info));
    }
    PyObject* version = PyTuple_GET_ITEM(info.ptr(), 0);
    static PyObject* const zero = PyLong_FromLong(0);  // CPython's cached 0: what producers return
    if (version != zero && (!PyLong_Check(version) || PyBool_Check(version) || PyLong_AsLong(version) != 0)) {
        PyErr_Clear();  // (a version beyond a C long)
        raise_usage("stream: __cuda_stream__() of " + arrays::typename_of(obj) + " gives protocol version " +
                    arrays::repr_of(version) + "; mpbind reads version 0");
    }
    return stream_value(PyTuple_GET_ITEM(info.ptr(), 1), "__cuda_stream__()[1]");
}

// getattr(obj, name) when present (the instance's own attributes), its failure reported as the stream's.
nb::object optional_stream_attr(nb::handle obj, PyObject* name, const char* how) {
    try {
        return arrays::optional_attr(obj, name);
    } catch (nb::python_error& e) {
        e.restore();
        raise_stream_failed(obj, how);
    }
}

}  // namespace

uintptr_t stream_handle(nb::handle obj) {
    if (obj.is_none()) return 0;
    if (PyLong_Check(obj.ptr()) && !PyBool_Check(obj.ptr())) return stream_value(obj, "an int stream");
    const auto& n = arrays::names();
    switch (stream_via(Py_TYPE(obj.ptr()))) {
        case StreamVia::kProtocol:
            return stream_protocol(obj, stream_attr(obj, n.cuda_stream_protocol, "__cuda_stream__"));
        case StreamVia::kCudaStream:
            return stream_value(stream_attr(obj, n.cuda_stream, ".cuda_stream"), ".cuda_stream");
        case StreamVia::kPtr: return stream_value(stream_attr(obj, n.ptr, ".ptr"), ".ptr");
        case StreamVia::kNone: break;
    }
    // Attributes of the instance alone (not of its type): looked up each time.
    if (nb::object m = optional_stream_attr(obj, n.cuda_stream_protocol, "__cuda_stream__"); m.is_valid()) {
        return stream_protocol(obj, m);
    }
    if (nb::object v = optional_stream_attr(obj, n.cuda_stream, ".cuda_stream"); v.is_valid()) {
        return stream_value(v, ".cuda_stream");
    }
    if (nb::object v = optional_stream_attr(obj, n.ptr, ".ptr"); v.is_valid()) return stream_value(v, ".ptr");
    raise_type("stream must be an int, None, or an object with __cuda_stream__, .cuda_stream or .ptr, not " +
               arrays::typename_of(obj));
}

// --- mpbind._core: the same coercion for the layer's cold paths and for tests -------------------

namespace {

arrays::Source source_named(const std::string& name) {
    for (auto s : {arrays::Source::kTuple, arrays::Source::kSymmetric, arrays::Source::kPeer, arrays::Source::kBuffer,
                   arrays::Source::kExchange, arrays::Source::kTorch, arrays::Source::kCupy,
                   arrays::Source::kInterface, arrays::Source::kDlpack}) {
        if (name == arrays::source_name(s)) return s;
    }
    raise_usage("unknown array source '" + name + "'");
}

nb::tuple dims(const arrays::Dims& d) {
    nb::object t = nb::steal(PyTuple_New(static_cast<Py_ssize_t>(d.size())));
    for (size_t i = 0; i < d.size(); ++i) {
        PyTuple_SET_ITEM(t.ptr(), static_cast<Py_ssize_t>(i), PyLong_FromLongLong(d[i]));
    }
    return nb::borrow<nb::tuple>(t);
}

nb::tuple described(const arrays::Array& a) {
    return nb::make_tuple(a.ptr, dims(a.shape), dims(a.strides), arrays::name(a.dtype), a.device, a.readonly,
                          a.contiguous, arrays::source_name(a.source));
}

}  // namespace

void register_arrays(nb::module_& m) {
    m.def("array_info", [](nb::handle obj, const char* what, nb::handle source, bool tuples) {
        if (source.is_none()) return described(arrays::describe(obj, what, tuples));
        if (!PyUnicode_Check(source.ptr())) raise_type("source must be a str or None, not " + arrays::typename_of(source));
        return described(arrays::describe_via(obj, what, source_named(nb::cast<std::string>(source))));
    }, nb::arg("array").none(), nb::arg("what") = "array", nb::arg("source").none() = nb::none(),
       nb::arg("tuples") = false,
       "Describe an array as the hot calls do: (ptr, shape, strides in elements, dtype name, device (-1: host, "
       "-2: unknown), readonly, C-contiguous, source). `source` forces one path ('exchange', 'dlpack', "
       "'interface', 'torch', 'cupy', ...); `tuples` accepts (ptr, count, dtype).");
    m.def("device_array", [](nb::handle obj, const char* what, nb::handle dtype, bool writable, bool contiguous) {
        arrays::Want want{what, writable, contiguous, false};
        if (!dtype.is_none()) want.dtype = arrays::dtype_of(dtype);
        return described(arrays::device_array(obj, want));
    }, nb::arg("array").none(), nb::arg("what"), nb::arg("dtype").none() = nb::none(), nb::arg("writable") = false,
       nb::arg("contiguous") = true,
       "array_info() checked as the hot calls check their operands: in GPU memory, of `dtype`, C-contiguous, "
       "writable, as asked (UsageError naming `what` otherwise).");
    m.def("dtype_info", [](nb::handle dtype) {
        const arrays::DtypeInfo& i = arrays::info(arrays::dtype_of(dtype));
        // The name interned: arrays that keep it (a SymmetricArray's dtype) are then described through
        // the by-identity dtype cache instead of comparing names (~60 ns of ~340 per description).
        nb::object name = nb::steal(PyUnicode_InternFromString(i.name));
        if (!name.is_valid()) throw nb::python_error();
        return nb::make_tuple(name, i.itemsize, i.dl_code, i.dl_bits, i.typestr ? nb::object(nb::str(i.typestr))
                                                                                : nb::none());
    }, nb::arg("dtype").none(),
       "(name, itemsize, DLPack code, DLPack bits, typestr or None) of a dtype; UsageError for unsupported ones.");
    m.def("stream_handle", [](nb::handle s) { return stream_handle(s); }, nb::arg("stream").none(),
          "The cudaStream_t of an int, None, or a __cuda_stream__/CuPy/PyTorch stream.");

    nb::module_ testing = nb::borrow<nb::module_>(m.attr("_testing"));
    testing.def("coerce_ns", [](nb::handle obj, size_t n, nb::handle source, bool tuples) {
        std::optional<arrays::Source> via;
        if (!source.is_none()) via = source_named(nb::cast<std::string>(source));
        uintptr_t sink = 0;
        double ns = ns_per_call(n, [&] {
            sink ^= (via ? arrays::describe_via(obj, "array", *via) : arrays::describe(obj, "array", tuples)).ptr;
        });
        (void)sink;
        return ns;
    }, nb::arg("array").none(), nb::arg("n"), nb::arg("source").none() = nb::none(), nb::arg("tuples") = true,
       "Nanoseconds per description of `array` in C++ (n times; `source` forces a path): the coercion's own cost.");
    testing.def("symmetric_parts_ns", [](nb::handle obj, size_t n) {
        PyTypeObject* type = Py_TYPE(obj.ptr());
        arrays::Path scratch;
        const arrays::Path& p = arrays::path_of(type, scratch);
        if (p.source != arrays::Source::kSymmetric) raise_usage("symmetric_parts_ns: not a SymmetricArray");
        uintptr_t sink = 0;
        auto per_call = [&](auto&& step) { return ns_per_call(n, step); };
        nb::dict out;
        out["path"] = per_call([&] {
            arrays::Path sc;
            sink ^= static_cast<uintptr_t>(arrays::path_of(type, sc).source);
        });
        // The array's own description (made once, when the array was made), copied with its address.
        out["kept"] = per_call([&] {
            arrays::Array a;
            nvshmem::describe_symmetric(obj, a, "array");
            sink ^= a.ptr;
        });
        out["whole"] = per_call([&] { sink ^= arrays::describe(obj, "array", false).ptr; });
        (void)sink;
        return out;
    }, nb::arg("array"), nb::arg("n"),
       "Nanoseconds per step of describing a SymmetricArray in C++ (n times each): the type's path, copying the "
       "description the array holds (with the allocation's address, checked open), and the whole description.");
    testing.def("stream_ns", [](nb::handle stream, size_t n) {
        uintptr_t sink = 0;
        double ns = ns_per_call(n, [&] { sink ^= stream_handle(stream); });
        (void)sink;
        return ns;
    }, nb::arg("stream").none(), nb::arg("n"), "Nanoseconds per stream_handle(`stream`) in C++.");
}

}  // namespace mpbind
