// Arrays and streams as the layer's hot calls take them: one pass in C++ from a Python object to
// what a library call needs (pointer, element count, element type, device, contiguity, read-only).
//
// Sources, tried in this order and remembered per Python type (so each call makes one lookup):
//   (ptr, count, dtype) tuples, where the call accepts them;
//   our own arrays: mpbind.nvshmem.SymmetricArray / PeerArray (the core's types, by C++ type), mpbind.nccl.Buffer;
//   types with DLPack's C exchange API (__dlpack_c_exchange_api__: PyTorch >= 2.11), which fill a
//     DLTensor with no Python call;
//   PyTorch tensors of older releases and CuPy arrays, through a few attributes;
//   anything else through __cuda_array_interface__ (v2/v3), falling back to __dlpack__ (versioned
//     capsules) when the interface is missing, raises (float8 tensors) or names no element type.
// Nothing here calls a library: refusals are UsageError/TypeError naming the argument.
//
// One intake: every path above ends in the same checks (validate() in arrays.cpp), so that nothing a
// caller hands in makes the core compute a wrong size or address:
//   * ndim is bounded (0 to kMaxNdim) by each reader before it reads or allocates for the extents: a
//     DLPack tensor's ndim, the length of a shape or strides sequence (a DLPack NULL shape with
//     ndim > 0 is refused too); a DLPack data + byte_offset must not pass 2**64;
//   * every extent >= 0 (UsageError); extents, strides and counts are ints within 64 bits (TypeError,
//     OverflowError);
//   * the element count and the byte size fit in 2**63 - 1 (OverflowError);
//   * the bytes the elements cover, from the lowest to the highest addressed element given the
//     strides, lie in [0, 2**64) (UsageError); an empty array addresses nothing;
//   * a device ordinal is >= 0, or -1 for host memory (UsageError);
//   * our own arrays hold no more than their symmetric allocation (UsageError, when made).
// An Array that describe() returns therefore never overflows in size, nbytes(), ptr + nbytes().

#pragma once

#include <nanobind/nanobind.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mpbind::arrays {

namespace nb = nanobind;

// Arrays of more dimensions are refused (NumPy 2's limit: every real array passes).
constexpr size_t kMaxNdim = 64;

// The element types the layer names ("float32", "bfloat16", ...).
enum class Dtype : uint8_t {
    kInvalid,
    kBool,
    kInt8,
    kInt16,
    kInt32,
    kInt64,
    kUInt8,
    kUInt16,
    kUInt32,
    kUInt64,
    kFloat16,
    kBFloat16,
    kFloat32,
    kFloat64,
    kComplex64,
    kComplex128,
    kFloat8E4M3FN,
    kFloat8E5M2,
};

struct DtypeInfo {
    const char* name;     // our name, as _interop.dtype_name() returns it
    uint8_t dl_code;      // DLPack type code and bits
    uint8_t dl_bits;
    int itemsize;
    int nccl;             // ncclDataType_t, or -1 where NCCL has no such type
    const char* typestr;  // __cuda_array_interface__ typestr, or nullptr where NumPy has none
};

const DtypeInfo& info(Dtype d);
inline const char* name(Dtype d) { return info(d).name; }
// Our element type of `dtype`: a name ("float32", "torch.bfloat16", aliases such as "half"), a
// NumPy dtype or scalar type, a framework dtype (torch.float8_e4m3fn, jnp.bfloat16). UsageError
// listing the supported names otherwise. NumPy is asked only about objects of NumPy's own.
Dtype dtype_of(nb::handle dtype);

// Where the description of an array came from (for tests and the coercion benchmark).
enum class Source : uint8_t {
    kTuple,      // (ptr, count, dtype)
    kSymmetric,  // mpbind.nvshmem.SymmetricArray
    kPeer,       // mpbind.nvshmem.PeerArray
    kBuffer,     // mpbind.nccl.Buffer, as bytes
    kExchange,   // DLPack C exchange API
    kTorch,      // a PyTorch tensor's attributes
    kCupy,       // a CuPy array's attributes
    kInterface,  // __cuda_array_interface__
    kDlpack,     // __dlpack__
};
const char* source_name(Source s);

// Extents or strides: a few inline, more on the heap.
class Dims {
public:
    // n elements whose values the caller then sets, every one (none is zeroed: a zeroed pair of
    // Dims cost ~20 ns of a ~80 ns description).
    void resize_for_overwrite(size_t n);
    size_t size() const { return n_; }
    int64_t* data() { return n_ <= kInline ? inline_ : heap_.data(); }
    const int64_t* data() const { return n_ <= kInline ? inline_ : heap_.data(); }
    int64_t operator[](size_t i) const { return data()[i]; }
    int64_t& operator[](size_t i) { return data()[i]; }

    // Copies and moves take the n elements in use: the rest of inline_ is never read.
    Dims() = default;
    Dims(const Dims& o) : heap_(o.heap_), n_(o.n_) { copy_inline(o); }
    Dims(Dims&& o) noexcept : heap_(std::move(o.heap_)), n_(o.n_) { copy_inline(o); }
    Dims& operator=(const Dims& o) {
        if (this != &o) {
            heap_ = o.heap_;
            n_ = o.n_;
            copy_inline(o);
        }
        return *this;
    }
    Dims& operator=(Dims&& o) noexcept {
        if (this != &o) {
            heap_ = std::move(o.heap_);
            n_ = o.n_;
            copy_inline(o);
        }
        return *this;
    }

private:
    void copy_inline(const Dims& o) {
        if (n_ <= kInline) std::copy_n(o.inline_, n_, inline_);
    }

    static constexpr size_t kInline = 8;
    int64_t inline_[kInline];
    std::vector<int64_t> heap_;
    size_t n_ = 0;
};

// What describe() returns satisfies the intake rules above.
struct Array {
    uintptr_t ptr = 0;
    int64_t size = 0;  // elements
    Dtype dtype = Dtype::kInvalid;
    int device = -1;   // CUDA device ordinal; -1: host memory; -2: not known (a Buffer of unknown device)
    // C order: any zero-size extent makes an array contiguous, extents of 1 ignore their stride, every
    // other stride is the product of the extents after it.
    bool contiguous = true;
    bool readonly = false;
    Source source = Source::kTuple;
    Dims shape, strides;  // strides in elements
    uintptr_t symmetric = 0;  // kSymmetric: the allocation's base (the array is known to be symmetric)

    int64_t itemsize() const { return info(dtype).itemsize; }
    int64_t nbytes() const { return size * itemsize(); }
};

// `obj` described, with no requirement on device or layout. `what` names it in messages ("sendbuf");
// `tuples`: a (ptr, count, dtype) tuple is accepted. TypeError for what is not an array.
Array describe(nb::handle obj, const char* what, bool tuples);

// What a hot call requires of an argument beyond being an array.
struct Want {
    const char* what;
    bool writable = false;
    bool contiguous = true;
    bool tuples = false;
    Dtype dtype = Dtype::kInvalid;  // kInvalid: any
};
// describe(), then: in GPU memory (tuples are taken on trust), of `dtype`, C-contiguous, writable, as
// asked (in this order).
Array device_array(nb::handle obj, const Want& want);

// A C-order array of `shape` (a sequence of ints) and `dtype` on `device` at `ptr`, through the intake
// rules: the description the core's own array types make once (nvshmem.cpp).
Array describe_c_order(uintptr_t ptr, nb::handle shape, nb::handle dtype, int device, Source source,
                       const char* what);

// `source` forces one path (tests and the coercion benchmark compare paths on the same object).
Array describe_via(nb::handle obj, const char* what, Source source);

// The same rules for a C-order array the core exports over `ptr` (mpbind._core.dlpack_view):
// UsageError/OverflowError naming `what` when `shape` of (DLPack code, bits) from `ptr` breaks one.
void check_export(uintptr_t ptr, const std::vector<size_t>& shape, uint8_t code, uint8_t bits, int device,
                  const char* what);

// A framework whose tensor type has the DLPack C exchange API (__dlpack_c_exchange_api__): what a
// kernel called from Python needs to make the framework's own tensor and run on the framework's
// stream with no Python in between (mpbind.torch's eager calls).
class Producer {
public:
    // The producer of `obj`'s type; valid() is false where the type has no exchange API, or one
    // without an allocator, a way back to Python or a current stream.
    static Producer of(nb::handle obj);
    bool valid() const { return api_ != nullptr; }
    // A new C-contiguous array of `shape` and `dtype` on CUDA device `device` from the producer's
    // allocator, as the producer's Python object; its data pointer in `ptr`. An allocation that is
    // not what was asked for (extents, dtype, device, layout) is refused, naming `what`.
    nb::object empty(const Dims& shape, Dtype dtype, int device, uintptr_t& ptr, const char* what) const;
    // The producer's current stream on CUDA device `device`.
    uintptr_t stream(int device, const char* what) const;

private:
    const void* api_ = nullptr;
};

// Streams are read by mpbind::stream_handle (core.hpp), defined in arrays.cpp with the arrays.

// For messages: repr_of(obj) and type(obj).__name__.
std::string repr_of(nb::handle obj);
std::string typename_of(nb::handle obj);

// An int argument that is not a bool (ints and objects with __index__, e.g. NumPy integers);
// false when `obj` is none of these. OverflowError beyond 64 bits.
bool as_index(nb::handle obj, long long& out);

}  // namespace mpbind::arrays
