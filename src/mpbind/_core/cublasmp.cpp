// cuBLASMp objects: Handle, the grid cache, matrix and matmul descriptors,
// Workspace (cublasMpMalloc, registered on every grid it serves), refcounted
// buffer registrations on grids, and a planned matmul whose execute() is one
// library call.

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <tuple>

#include "mpbind/bindings/_core_abi/cublasmp.hpp"
#include "mpbind/bindings/_core_abi/cuda_driver.hpp"
#include "arrays.hpp"
#include "launch.hpp"
#include "nccl.hpp"
#include "register.hpp"

namespace mpbind::cublasmp {

namespace {

using namespace abi::cublasmp;
using capi::call;
using capi::check;
using i64 = int64_t;

// CUDA graphs through the driver API that cuda-bindings exports (its own loader).
namespace cu = abi::cuda_driver;

// --- host workspaces ---

// cuBLASMp asks (cublasMpMatmul_bufferSize) for host workspaces of KiB to a few MiB; a size asked of
// Handle.host_workspace beyond this is a mistake, refused before anything is allocated.
constexpr size_t kMaxHostWorkspace = size_t{1} << 32;

// Zeroed host memory from calloc: a large one costs address space, not pages, until it is used.
// A failed allocation is cuBLASMp's ALLOCATION_FAILED error (an mpbind.errors class), not MemoryError.
class HostWorkspace {
public:
    void assign(size_t nbytes, const char* what) {
        void* p = std::calloc(std::max<size_t>(nbytes, 1), 1);
        if (p == nullptr) {
            raise_library_error("cublasmp", what, CUBLASMP_STATUS_ALLOCATION_FAILED,
                                "could not allocate " + std::to_string(nbytes) + " bytes of host memory");
        }
        mem_.reset(static_cast<unsigned char*>(p));
        size_ = nbytes;
    }
    bool empty() const { return size_ == 0; }
    size_t size() const { return size_; }
    unsigned char* data() const { return mem_.get(); }
    void clear() {
        mem_.reset();
        size_ = 0;
    }

private:
    struct Free {
        void operator()(unsigned char* p) const { std::free(p); }
    };
    std::unique_ptr<unsigned char, Free> mem_;
    size_t size_ = 0;
};

// A host workspace of `nbytes` asked for by name (Handle.host_workspace): UsageError beyond the cap.
HostWorkspace asked_host_workspace(size_t nbytes) {
    if (nbytes > kMaxHostWorkspace) {
        raise_usage("host_workspace: nbytes is " + std::to_string(nbytes) + "; cuBLASMp's host workspaces are "
                    "far smaller, and mpbind allocates at most 2**32 bytes for one");
    }
    HostWorkspace w;
    w.assign(nbytes, "Handle.host_workspace");
    return w;
}

// --- handle ---

class HandleState : public State {
public:
    HandleState(void* h, uintptr_t stream) : State("cublasmp.Handle"), handle(h), stream(stream) {}
    void* handle;
    uintptr_t stream;
    // Held around setting the stream and the call on it: a framework's launch (no GIL) and the
    // layer's own calls on this handle take turns.
    std::mutex calls;
    // `calls` for one of the layer's calls. A launch holds it while it queues its work: waited for as
    // every wait of the layer is (the GIL let go, Ctrl-C honoured, the process's deadline).
    std::unique_lock<std::mutex> take_calls() {
        std::unique_lock<std::mutex> lock(calls, std::defer_lock);
        if (!lock.try_lock()) {
            wait_until("a cuBLASMp call of another thread on this handle", default_timeout(),
                       [&] { return lock.try_lock(); });
        }
        return lock;
    }
    // `calls` for a release, which raises nothing: waited for until the launch under way has queued
    // its work, the GIL let go.
    std::unique_lock<std::mutex> take_calls_to_release() {
        std::unique_lock<std::mutex> lock(calls, std::try_to_lock);
        if (!lock.owns_lock()) {
            nb::gil_scoped_release release;
            lock.lock();
        }
        return lock;
    }
    // Host workspaces of one-shot calls (gemm): kept with the handle, since the library may
    // still use one after the call returns; grown by adding a larger one, never shrunk.
    std::vector<HostWorkspace> host_scratch;

    void* host_workspace(size_t nbytes) {
        if (host_scratch.empty() || host_scratch.back().size() < nbytes) {
            host_scratch.push_back(asked_host_workspace(nbytes));
        }
        return host_scratch.back().data();
    }

    void set_stream(uintptr_t s) {
        if (s == stream) return;
        call(api().cublasMpSetStream, handle, reinterpret_cast<void*>(s));
        stream = s;
    }

protected:
    void release() override { call(api().cublasMpDestroy, handle); }
};
using Handle = Ref<HandleState>;  // cublasMpHandle_t (the library's term)

// --- grids and their cache ---

class GridState;
using GridKey = std::tuple<uint64_t, int, i64, i64, int>;  // comm serial, device, nprow, npcol, layout
Cache<GridKey, GridState>& grid_cache() {
    static auto* c = new Cache<GridKey, GridState>();
    return *c;
}

class GridState : public State {
public:
    GridState(void* g, std::shared_ptr<nccl::CommState> comm, i64 nprow, i64 npcol, int layout)
        : State("cublasmp.Grid"), grid(g), comm(std::move(comm)), nprow(nprow), npcol(npcol),
          layout(layout) {}
    void* grid;
    std::shared_ptr<nccl::CommState> comm;
    i64 nprow, npcol;
    int layout;
    Registry registrations;
    // Workspaces the matmul plans on this grid share (grown, never shrunk);
    // released with the grid, since cublasMpFree is collective.
    std::vector<std::shared_ptr<State>> workspaces;

    // Over a failed communicator (aborted or revoked) a grid's collective releases cannot run: they
    // are skipped, and what they hold is left to the process's end.
    bool comm_failed() const { return comm->failed(); }

protected:
    void release() override {
        workspaces.clear();
        grid_cache().erase(this);
        if (comm_failed()) return;
        call(api().cublasMpGridDestroy, grid);
    }
};
using Grid = Ref<GridState>;

class BufferRegistration : public RegistrationState {
public:
    using RegistrationState::RegistrationState;
    std::shared_ptr<GridState> grid;

protected:
    void deregister() override {
        if (grid->comm_failed()) return;
        call(api().cublasMpBufferDeregister, grid->grid, reinterpret_cast<void*>(ptr));
    }
};

RegistrationRef register_on(GridState& g, uintptr_t ptr, size_t size, nb::object buffer) {
    g.comm->refuse_if_failed();
    if (ptr == 0) raise_usage("cannot register a NULL pointer");
    if (size == 0) raise_usage("cannot register 0 bytes");
    auto self = std::static_pointer_cast<GridState>(g.shared_from_this());
    return g.registrations.acquire(g, ptr, size, [&]() -> std::shared_ptr<RegistrationState> {
        call(api().cublasMpBufferRegister, g.grid, reinterpret_cast<void*>(ptr), size);
        auto r = std::make_shared<BufferRegistration>("cublasmp.Registration", ptr, size, std::move(buffer));
        r->grid = self;
        return r;
    });
}

// --- descriptors ---

class MatrixState : public State {
public:
    MatrixState(void* d, i64 m, i64 n, i64 mb, i64 nb, i64 rsrc, i64 csrc, i64 lld, int dtype)
        : State("cublasmp.MatrixDescriptor"), desc(d), m(m), n(n), mb(mb), nb(nb), rsrc(rsrc),
          csrc(csrc), lld(lld), dtype(dtype) {}
    void* desc;
    i64 m, n, mb, nb, rsrc, csrc, lld;
    int dtype;
    std::shared_ptr<GridState> grid;

protected:
    void release() override { call(api().cublasMpMatrixDescriptorDestroy, desc); }
};
using MatrixDescriptor = Ref<MatrixState>;

class MatmulDescState : public State {
public:
    MatmulDescState(void* d, int compute) : State("cublasmp.MatmulDescriptor"), desc(d), compute(compute) {}
    void* desc;
    int compute;

protected:
    void release() override { call(api().cublasMpMatmulDescriptorDestroy, desc); }
};
using MatmulDescriptor = Ref<MatmulDescState>;

// --- workspace ---

class WorkspaceState : public State {
public:
    // A grid's shared workspace (`shared`) is released with the grid, another when dropped.
    WorkspaceState(void* p, size_t size, std::shared_ptr<GridState> grid, bool shared)
        : State(shared ? "cublasmp.SharedWorkspace" : "cublasmp.Workspace"), ptr(p), size(size),
          grid(std::move(grid)) {}
    void* ptr;
    size_t size;
    std::shared_ptr<GridState> grid;       // the grid it was allocated on
    std::vector<RegistrationRef> served;   // registrations on the other grids it serves

    // Register on each grid of `grids` not yet served; all or nothing.
    void serve(const std::vector<std::shared_ptr<GridState>>& grids) {
        std::vector<RegistrationRef> added;
        try {
            for (auto& g : grids) {
                if (g.get() == grid.get()) continue;
                bool known = false;
                for (auto& r : served) known = known || std::static_pointer_cast<BufferRegistration>(r.state())->grid == g;
                for (auto& r : added) known = known || std::static_pointer_cast<BufferRegistration>(r.state())->grid == g;
                if (!known) added.push_back(register_on(*g, reinterpret_cast<uintptr_t>(ptr), size, nb::none()));
            }
        } catch (...) {
            // Roll back what succeeded, newest first, then report the failure.
            for (auto it = added.rbegin(); it != added.rend(); ++it) {
                try {
                    it->close();
                } catch (nb::python_error&) {
                }
            }
            throw;
        }
        for (auto& r : added) served.push_back(std::move(r));
    }

protected:
    void release() override {
        for (auto it = served.rbegin(); it != served.rend(); ++it) it->close();
        served.clear();
        if (grid->comm_failed()) return;
        call(api().cublasMpFree, grid->grid, ptr);
    }
};
using Workspace = Ref<WorkspaceState>;

std::shared_ptr<WorkspaceState> make_workspace(const std::shared_ptr<GridState>& g, size_t nbytes, bool shared) {
    g->check_open();
    g->comm->refuse_if_failed();
    if (nbytes == 0) raise_usage("workspace size must be > 0");
    void* p = nullptr;
    call(api().cublasMpMalloc, g->grid, &p, nbytes);
    auto w = std::make_shared<WorkspaceState>(p, nbytes, g, shared);
    w->depends_on(g);
    g->add_child(w);
    return w;
}

std::shared_ptr<WorkspaceState> shared_workspace(const std::shared_ptr<GridState>& g, size_t nbytes) {
    Lock l = lock(g->mutex());
    if (!g->workspaces.empty()) {
        auto last = std::static_pointer_cast<WorkspaceState>(g->workspaces.back());
        if (!last->closed() && last->size >= nbytes) return last;
    }
    size_t grow = 0;  // twice the last one (saturating: a size near 2**64 cannot be allocated anyway)
    if (!g->workspaces.empty()) {
        size_t last = std::static_pointer_cast<WorkspaceState>(g->workspaces.back())->size;
        if (__builtin_mul_overflow(last, size_t{2}, &grow)) grow = last;
    }
    auto w = make_workspace(g, std::max(nbytes, grow), true);
    g->workspaces.push_back(w);
    return w;
}

// --- a planned matmul ---

struct Operand {
    uintptr_t ptr = 0;
    i64 i = 1, j = 1;
    std::shared_ptr<MatrixState> desc;
};

class MatmulPlanState : public State {
public:
    MatmulPlanState() : State("cublasmp.MatmulPlan") {}
    std::shared_ptr<HandleState> handle;
    std::shared_ptr<MatmulDescState> mm;
    bool owns_descriptor = false;  // `mm` is closed with the plan (else its creator keeps it)
    i64 m = 0, n = 0, k = 0;
    Operand a, b, c, d;
    std::array<unsigned char, 16> alpha{}, beta{};
    size_t device_bytes = 0, host_bytes = 0;
    std::shared_ptr<WorkspaceState> workspace;
    HostWorkspace host_workspace;
    nb::object keep;  // the operand arrays
    void* graph = nullptr;  // CUgraph / CUgraphExec of the captured call, once captured
    void* graph_exec = nullptr;

    // The pointers of a call: the planned operands', or new arrays' of the same shapes (0: planned).
    using Pointers = std::array<uintptr_t, 4>;

    // `fn` (cublasMpMatmul or its _bufferSize) on this plan's operands (at `ptrs`), then `tail...`,
    // without the GIL; raises its error unless it succeeded. The hot path of execute(): one direct call.
    template <class F, class... Tail>
    void with_operands(const F& fn, const Pointers& ptrs, Tail... tail) {
        cublasMpStatus_t status;
        {
            nb::gil_scoped_release release;
            status = raw(fn, ptrs, tail...);
        }
        if (status != success) check(fn, capi::returned(fn, status));
    }

    // `fn` on the operands at `ptrs`, as it returns (any thread, no GIL needed).
    template <class F, class... Tail>
    cublasMpStatus_t raw(const F& fn, const Pointers& ptrs, Tail... tail) {
        auto ptr = [&](const Operand& o, int i) { return reinterpret_cast<void*>(ptrs[i] ? ptrs[i] : o.ptr); };
        auto desc = [](const Operand& o) { return o.desc ? o.desc->desc : nullptr; };
        return fn.ptr(handle->handle, mm->desc, m, n, k, alpha.data(), ptr(a, 0), a.i, a.j, desc(a), ptr(b, 1), b.i,
                      b.j, desc(b), beta.data(), ptr(c, 2), c.i, c.j, desc(c), ptr(d, 3), d.i, d.j, desc(d), tail...);
    }

    // The matmul on the operands at `ptrs`, queued on `stream` by a framework's launch (no GIL;
    // handle->calls held): the library's status. The handle is pointed at `stream` for the call and
    // back after it, so that the layer's calls keep the handle's own stream as their default.
    cublasMpStatus_t launch(uintptr_t stream, const Pointers& ptrs) {
        auto set_stream = api().cublasMpSetStream.ptr;
        uintptr_t own = handle->stream;
        if (own != stream) {
            cublasMpStatus_t st = set_stream(handle->handle, reinterpret_cast<void*>(stream));
            if (st != success) return st;
        }
        void* dws = workspace ? workspace->ptr : nullptr;
        void* hws = host_workspace.empty() ? nullptr : host_workspace.data();
        cublasMpStatus_t st = raw(api().cublasMpMatmul, ptrs, dws, device_bytes, hws, host_bytes);
        if (own != stream) {
            cublasMpStatus_t back = set_stream(handle->handle, reinterpret_cast<void*>(own));
            if (st == success) st = back;
        }
        return st;
    }

    void size_workspaces() { with_operands(api().cublasMpMatmul_bufferSize, Pointers{}, &device_bytes, &host_bytes); }

    void call_library(const Pointers& ptrs = {}) {
        mm->check_open();  // a descriptor the caller kept may be closed before the plan
        void* dws = workspace ? workspace->ptr : nullptr;
        void* hws = host_workspace.empty() ? nullptr : host_workspace.data();
        with_operands(api().cublasMpMatmul, ptrs, dws, device_bytes, hws, host_bytes);
    }

    // Record one call into a CUDA graph on `stream`; execute() then replays it.
    void capture(uintptr_t stream) {
        check_open();
        handle->check_open();
        if (graph_exec) raise_usage("this matmul is already captured");
        if (stream == 0) raise_usage("capture needs a stream other than the default (legacy) stream");
        const cu::Api& drv = cu::api();
        auto turn = handle->take_calls();
        handle->set_stream(stream);
        void* s = reinterpret_cast<void*>(stream);
        call(drv.cuStreamBeginCapture, s, cu::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
        void* g = nullptr;
        try {
            call_library();
        } catch (...) {
            drv.cuStreamEndCapture.ptr(s, &g);  // leave the stream usable
            if (g) drv.cuGraphDestroy.ptr(g);
            throw;
        }
        call(drv.cuStreamEndCapture, s, &g);
        void* exec = nullptr;
        try {
            call(drv.cuGraphInstantiate, &exec, g, 0);
        } catch (...) {
            drv.cuGraphDestroy.ptr(g);
            throw;
        }
        graph = g;
        graph_exec = exec;
    }

    // The communicator the matmul runs over (its operands' grid's).
    nccl::CommState& comm() const { return *a.desc->grid->comm; }

    void execute(uintptr_t stream, const Pointers& ptrs = {}) {
        check_open();
        handle->check_open();
        if (graph_exec && ptrs != Pointers{}) {
            raise_usage("a captured matmul replays the operands it recorded; new operands need a plan that is "
                        "not captured");
        }
        // Refused over a failed communicator; in its flight record (and watched) when it is watched.
        nccl::CommState& c = comm();
        auto turn = handle->take_calls();
        uint64_t seq = nccl::begin_foreign(c, "cublasmp.matmul", stream);
        try {
            if (graph_exec) {
                call(cu::api().cuGraphLaunch, graph_exec, reinterpret_cast<void*>(stream));
            } else {
                handle->set_stream(stream);
                call_library(ptrs);
            }
        } catch (...) {
            nccl::end_foreign(c, seq, stream, false);
            throw;
        }
        nccl::end_foreign(c, seq, stream, true);
    }

protected:
    void release() override {
        auto turn = handle->take_calls_to_release();  // after a launch under way (releasing() is set: none starts)
        if (graph_exec) cu::api().cuGraphExecDestroy.ptr(graph_exec);
        if (graph) cu::api().cuGraphDestroy.ptr(graph);
        graph_exec = graph = nullptr;
        workspace.reset();  // a shared Workspace is released by its own owner
        host_workspace.clear();
        keep = nb::object();
        if (owns_descriptor) mm->close();
    }
};
using MatmulPlan = Ref<MatmulPlanState>;

Operand operand(nb::handle spec, const char* what, bool optional) {
    Operand o;
    if (spec.is_none()) {
        if (!optional) raise_usage(std::string(what) + " is required");
        return o;
    }
    auto t = nb::cast<nb::tuple>(spec);
    if (nb::len(t) != 4) raise_type(std::string(what) + " must be (ptr, i, j, MatrixDescriptor)");
    o.ptr = nb::cast<uintptr_t>(t[0]);
    o.i = nb::cast<i64>(t[1]);
    o.j = nb::cast<i64>(t[2]);
    if (o.i < 1 || o.j < 1) raise_usage(std::string(what) + ": ia/ja are 1-based and must be >= 1");
    auto& h = nb::cast<MatrixDescriptor&>(t[3]);
    h.get();
    o.desc = h.state();
    return o;
}

// --- new operands for a planned matmul -------------------------------------------------------------

i64 numroc(i64 n, i64 nb, i64 iproc, i64 isrcproc, i64 nprocs) {
    i64 mydist = (nprocs + iproc - isrcproc) % nprocs;
    i64 nblocks = n / nb;
    i64 num = (nblocks / nprocs) * nb;
    i64 extra = nblocks % nprocs;
    if (mydist < extra) {
        num += nb;
    } else if (mydist == extra) {
        num += n % nb;
    }
    return num;
}

// (rows, columns) of the piece of an m x n matrix in mb x nb blocks, first block on (rsrc, csrc), that
// process `rank` holds on an nprow x npcol grid (as Matrix computes it).
std::pair<i64, i64> local_shape(i64 m, i64 n, i64 mb, i64 nb, i64 rsrc, i64 csrc, i64 nprow, i64 npcol, int layout,
                                i64 rank) {
    // What the descriptor and the grid were checked for when made (tests call this directly): no
    // division by zero, no overflow below.
    if (m < 0 || n < 0 || mb < 1 || nb < 1 || nprow < 1 || npcol < 1 || rsrc < 0 || rsrc >= nprow || csrc < 0 ||
        csrc >= npcol || rank < 0 || rank / npcol >= nprow) {
        raise_usage("local_shape: needs m, n >= 0, mb, nb >= 1, a grid of nprow, npcol >= 1, rsrc, csrc on the grid "
                    "and a rank in it");
    }
    bool col_major = layout == CUBLASMP_GRID_LAYOUT_COL_MAJOR;
    i64 prow = col_major ? rank % nprow : rank / npcol;
    i64 pcol = col_major ? rank / nprow : rank % npcol;
    return {numroc(m, mb, prow, rsrc, nprow), numroc(n, nb, pcol, csrc, npcol)};
}

arrays::Dtype element_type(int cuda_type) {
    using D = arrays::Dtype;
    switch (cuda_type) {
        case CUDA_R_16F: return D::kFloat16;
        case CUDA_R_16BF: return D::kBFloat16;
        case CUDA_R_32F: return D::kFloat32;
        case CUDA_R_64F: return D::kFloat64;
        case CUDA_C_32F: return D::kComplex64;
        case CUDA_C_64F: return D::kComplex128;
        case CUDA_R_8I: return D::kInt8;
        case CUDA_R_32I: return D::kInt32;
        case CUDA_R_8F_E4M3: return D::kFloat8E4M3FN;
        case CUDA_R_8F_E5M2: return D::kFloat8E5M2;
        default: return D::kInvalid;
    }
}

// What a new operand must match: the planned local piece.
struct Piece {
    i64 rows, cols, lld;
    arrays::Dtype dtype;
};

Piece piece_of(const MatrixState& m) {
    const GridState& g = *m.grid;
    auto [rows, cols] = local_shape(m.m, m.n, m.mb, m.nb, m.rsrc, m.csrc, g.nprow, g.npcol, g.layout, g.comm->rank);
    return {rows, cols, m.lld, element_type(m.dtype)};
}

// The pointer of `obj`, a column-major local piece standing in for a planned operand: same element
// type, same local shape, same leading dimension (the plan's descriptor describes it).
uintptr_t new_operand(nb::handle obj, const char* what, const Piece& p, bool writable) {
    arrays::Array a = arrays::device_array(obj, {what, writable, false, false, p.dtype});
    if (a.shape.size() != 2 || a.shape[0] != p.rows || a.shape[1] != p.cols) {
        std::string got = a.shape.size() == 2 ? std::to_string(a.shape[0]) + " x " + std::to_string(a.shape[1])
                                              : std::to_string(a.shape.size()) + "-D";
        raise_usage(std::string(what) + " is " + got + "; the plan's local piece is " + std::to_string(p.rows) + " x " +
                    std::to_string(p.cols));
    }
    if (a.strides[0] != 1 && p.rows > 1) {
        raise_usage(std::string(what) + " must be column-major (strides (1, lld)); got strides (" +
                    std::to_string(a.strides[0]) + ", " + std::to_string(a.strides[1]) + ") elements");
    }
    i64 lld = std::max<i64>(1, p.cols > 1 ? a.strides[1] : p.rows);
    if (lld != p.lld) {
        raise_usage(std::string(what) + " has leading dimension " + std::to_string(lld) +
                    "; the plan's descriptor has " + std::to_string(p.lld));
    }
    if (a.ptr == 0 && a.size > 0) raise_usage(std::string(what) + " is a NULL pointer");
    return a.ptr;
}

MatmulPlanState::Pointers new_operands(const MatmulPlanState& p, nb::handle a, nb::handle b, nb::handle c,
                                       nb::handle d) {
    MatmulPlanState::Pointers ptrs{};
    const char* names[] = {"a", "b", "c", "d"};
    const Operand* planned[] = {&p.a, &p.b, &p.c, &p.d};
    nb::handle given[] = {a, b, c, d};
    for (int i = 0; i < 4; ++i) {
        if (given[i].is_none()) continue;
        if (!planned[i]->desc) raise_usage(std::string(names[i]) + ": the plan was made without " + names[i]);
        ptrs[i] = new_operand(given[i], names[i], piece_of(*planned[i]->desc), i == 3);
    }
    return ptrs;
}

// --- launches from a framework's program (launch.hpp): no GIL, every failure a Status ---------------------

// A registered planned matmul (nullptr on a rank with nothing to compute) and, per operand a, b, c, d,
// the buffer a launch is given: its bytes and where the planned piece starts in it (a replicated
// operand's whole array holds the piece at an offset). Its descriptors keep the piece's leading
// dimension; at registration the piece at that offset was checked to lie inside those bytes.
struct MatmulLaunch {
    std::shared_ptr<MatmulPlanState> plan;
    struct Slot {
        bool used = false;
        size_t offset = 0;
        size_t bytes = 0;
    };
    std::array<Slot, 4> slots;
    int device = 0;
};

constexpr const char* kOperandNames[] = {"a", "b", "c", "d"};

// The bytes from a piece's first element to past its last (rows x cols, columns lld apart); SIZE_MAX
// where that overflows (no buffer holds it: refused).
size_t piece_extent(const MatrixState& m) {
    Piece p = piece_of(m);
    if (p.rows == 0 || p.cols == 0) return 0;
    auto itemsize = static_cast<size_t>(arrays::info(p.dtype).itemsize);
    size_t span = 0, elements = 0, bytes = 0;
    if (__builtin_mul_overflow(static_cast<size_t>(p.cols - 1), static_cast<size_t>(p.lld), &span) ||
        __builtin_add_overflow(span, static_cast<size_t>(p.rows), &elements) ||
        __builtin_mul_overflow(elements, itemsize, &bytes)) {
        return SIZE_MAX;
    }
    return bytes;
}

std::array<unsigned char, 16> scalar_bytes(nb::bytes b, const char* what) {
    std::array<unsigned char, 16> out{};
    if (b.size() == 0 || b.size() > out.size()) {
        raise_usage(std::string(what) + " must be 1 to 16 bytes (the scalar in the compute type)");
    }
    std::memcpy(out.data(), b.c_str(), b.size());
    return out;
}

}  // namespace

}  // namespace mpbind::cublasmp

namespace mpbind::launch {

Status matmul(uint64_t id, uintptr_t stream, int device, const std::array<const void*, 4>& ptrs,
              const std::array<size_t, 4>& bytes) {
    using namespace cublasmp;
    std::shared_ptr<MatmulLaunch> l = registry<MatmulLaunch>().find(id);
    if (!l) return unknown("planned matmul", id);
    std::string name = "the planned matmul (device " + std::to_string(l->device) + ")";
    if (device != l->device) return Status::invalid(name + ": the program runs on device " + std::to_string(device));
    for (size_t i = 0; i < 4; ++i) {
        const MatmulLaunch::Slot& s = l->slots[i];
        if (!s.used && (ptrs[i] != nullptr || bytes[i] != 0)) {
            return Status::invalid(name + " was planned without " + kOperandNames[i]);
        }
        if (s.used && bytes[i] != s.bytes) {
            return Status::invalid(name + ": " + kOperandNames[i] + " must be " + std::to_string(s.bytes) +
                                   " bytes on this rank, not " + std::to_string(bytes[i]));
        }
        if (s.used && s.bytes != 0 && ptrs[i] == nullptr) {
            return Status::invalid(name + ": " + kOperandNames[i] + " is a NULL pointer");
        }
    }
    if (!l->plan) return {};  // nothing to compute on this rank
    MatmulPlanState& p = *l->plan;
    std::lock_guard<std::mutex> turn(p.handle->calls);
    if (p.releasing() || p.handle->releasing() || p.mm->releasing()) return Status::invalid(name + " is closed");
    if (p.graph_exec) return Status::invalid(name + " is captured (it replays its own operands)");
    MatmulPlanState::Pointers at{};
    for (size_t i = 0; i < 4; ++i) {
        if (l->slots[i].used && ptrs[i]) at[i] = reinterpret_cast<uintptr_t>(ptrs[i]) + l->slots[i].offset;
    }
    nccl::LaunchGuard held(p.comm(), "cublasmp.matmul", stream);
    if (!held.refused.ok()) return held.refused;
    cublasMpStatus_t st = p.launch(stream, at);
    held.done(st == success);
    if (st != success) return Status::failed(name + ": cublasMpMatmul failed with status " + std::to_string(st));
    return {};
}

}  // namespace mpbind::launch

namespace mpbind {

void register_cublasmp(nb::module_& parent) {
    using namespace cublasmp;
    nb::module_ m = parent.def_submodule("cublasmp", "cuBLASMp objects of the core.");

    auto handle = nb::class_<Handle>(m, "Handle", "A cuBLASMp handle bound to a stream (cublasMpCreate).");
    handle.def("__init__", [](Handle* self, nb::handle stream) {
        uintptr_t s = stream_handle(stream);
        void* h = nullptr;
        call(api().cublasMpCreate, &h, reinterpret_cast<void*>(s));
        new (self) Handle(std::make_shared<HandleState>(h, s));
    }, nb::arg("stream").none() = nb::none(),
       nb::sig("def __init__(self, stream: mpbind.typing.Stream = None) -> None"))
        .def_prop_ro("stream", [](Handle& h) { return h.get().stream; })
        .def("set_stream", [](Handle& h, nb::handle s) { h.get().set_stream(stream_handle(s)); },
             nb::arg("stream").none(), nb::sig("def set_stream(self, stream: mpbind.typing.Stream) -> None"))
        .def("host_workspace", [](Handle& h, size_t nbytes) {
            return reinterpret_cast<uintptr_t>(h.get().host_workspace(nbytes));
        }, nb::arg("nbytes"), "A zeroed host workspace of at least `nbytes` (at most 2**32; UsageError beyond) that "
           "lives as long as the handle.");
    bind_c_pointer(handle, [](Handle& h) { return h.get().handle; }, "The cublasMpHandle_t, for the flat bindings.");
    bind_lifetime(handle, "cublasMpDestroy. Idempotent.");

    auto grid = nb::class_<Grid>(m, "Grid", "A cuBLASMp process grid over an NCCL communicator (cached).");
    grid.def_prop_ro("nprow", [](Grid& g) { return g.get().nprow; })
        .def_prop_ro("npcol", [](Grid& g) { return g.get().npcol; })
        .def_prop_ro("layout", [](Grid& g) { return g.get().layout; })
        .def_prop_ro("communicator", [](Grid& g) { return nccl::Communicator(g.get().comm); })
        .def("register", [](Grid& g, uintptr_t ptr, size_t size, nb::object buffer) {
            return register_on(g.get(), ptr, size, std::move(buffer));
        }, nb::arg("ptr"), nb::arg("size"), nb::arg("buffer") = nb::none(),
           "cublasMpBufferRegister (collective), reference-counted per (ptr, size).")
        .def("matrix_descriptor", [](Grid& g, i64 m_, i64 n_, i64 mb, i64 nb_, i64 rsrc, i64 csrc, i64 lld,
                                     int dtype) {
            GridState& gs = g.get();
            if (m_ < 0 || n_ < 0) raise_usage("matrix sizes must be >= 0");
            if (mb < 1 || nb_ < 1) raise_usage("block sizes mb, nb must be >= 1");
            if (rsrc < 0 || rsrc >= gs.nprow || csrc < 0 || csrc >= gs.npcol) {
                raise_usage("rsrc/csrc must name a process of the " + std::to_string(gs.nprow) + " x " +
                            std::to_string(gs.npcol) + " grid");
            }
            if (lld < 1) raise_usage("lld must be >= 1");
            // Columns lld elements apart must not overlap this process's rows: cuBLASMp does not check.
            i64 rows = local_shape(m_, n_, mb, nb_, rsrc, csrc, gs.nprow, gs.npcol, gs.layout, gs.comm->rank).first;
            if (lld < rows) {
                raise_usage("lld " + std::to_string(lld) + " < " + std::to_string(rows) + " local rows: a " +
                            std::to_string(m_) + "-row matrix in " + std::to_string(mb) + "-row blocks gives this "
                            "process " + std::to_string(rows) + " rows, and each column needs lld >= that");
            }
            void* d = nullptr;
            call(api().cublasMpMatrixDescriptorCreate, m_, n_, mb, nb_, rsrc, csrc, lld, dtype, gs.grid, &d);
            auto s = std::make_shared<MatrixState>(d, m_, n_, mb, nb_, rsrc, csrc, lld, dtype);
            s->grid = g.state();
            s->depends_on(g.state());
            gs.add_child(s);
            return MatrixDescriptor(s);
        }, nb::arg("m"), nb::arg("n"), nb::arg("mb"), nb::arg("nb"), nb::arg("rsrc"), nb::arg("csrc"),
           nb::arg("lld"), nb::arg("dtype"), "cublasMpMatrixDescriptorCreate on this grid.")
        .def("registrations", [](Grid& g) { return describe(g.get().registrations.live()); },
             nb::sig("def registrations(self) -> list[dict[str, typing.Any]]"), "Live registrations on this grid.");
    bind_c_pointer(grid, [](Grid& g) { return g.get().grid; }, "The cublasMpGrid_t, for the flat bindings.");
    bind_lifetime(grid, "cublasMpGridDestroy (collective) and drop it from the cache. Its communicator's close "
                        "does this for every grid on it.");

    // grid(), grid_cache_info() and MatmulPlan's execute, capture and properties are documented by
    // mpbind.cublasmp's wrappers (Matmul, grid(), ...), the public ones: not here too.
    m.def("grid", [](nccl::Communicator& comm, i64 nprow, i64 npcol, int layout) {
        auto cs = comm.state();
        nccl::CommState& c = comm.get();
        c.refuse_if_failed();
        if (nprow < 1 || npcol < 1) raise_usage("nprow and npcol must be >= 1");
        i64 ranks = 0;
        bool overflow = __builtin_mul_overflow(nprow, npcol, &ranks);
        if (overflow || ranks != c.size) {
            raise_usage("a " + std::to_string(nprow) + " x " + std::to_string(npcol) + " grid needs " +
                        (overflow ? std::string("more than 2**63 - 1") : std::to_string(ranks)) +
                        " ranks; the communicator has " + std::to_string(c.size));
        }
        if (layout != CUBLASMP_GRID_LAYOUT_COL_MAJOR && layout != CUBLASMP_GRID_LAYOUT_ROW_MAJOR) {
            raise_usage("layout must be GridLayout.COL_MAJOR (" + std::to_string(CUBLASMP_GRID_LAYOUT_COL_MAJOR) +
                        ") or ROW_MAJOR (" + std::to_string(CUBLASMP_GRID_LAYOUT_ROW_MAJOR) + ")");
        }
        GridKey key{c.serial(), c.device, nprow, npcol, layout};
        return Grid(grid_cache().get(key, [&] {
            void* g = nullptr;
            call(api().cublasMpGridCreate, nprow, npcol, layout, c.comm, &g);
            auto s = std::make_shared<GridState>(g, cs, nprow, npcol, layout);
            s->depends_on(cs);
            c.add_child(s);
            return s;
        }));
    }, nb::arg("comm"), nb::arg("nprow"), nb::arg("npcol"), nb::arg("layout") = 0);
    m.def("grid_cache_info", [] { return describe(grid_cache().info()); },
          nb::sig("def grid_cache_info() -> dict[str, int]"));

    auto md = nb::class_<MatrixDescriptor>(m, "MatrixDescriptor", "A distributed matrix layout on a grid.");
    md.def_prop_ro("shape", [](MatrixDescriptor& d) { return std::make_tuple(d.get().m, d.get().n); })
        .def_prop_ro("block", [](MatrixDescriptor& d) { return std::make_tuple(d.get().mb, d.get().nb); })
        .def_prop_ro("lld", [](MatrixDescriptor& d) { return d.get().lld; })
        .def_prop_ro("dtype", [](MatrixDescriptor& d) { return d.get().dtype; })
        .def("__repr__", [](MatrixDescriptor& d) {
            auto& s = *d.state();
            return nb::str("<cublasmp.MatrixDescriptor {}x{} in {}x{} blocks{}>")
                .format(s.m, s.n, s.mb, s.nb, s.closed() ? " closed" : "");
        });
    bind_c_pointer(md, [](MatrixDescriptor& d) { return d.get().desc; },
                   "The cublasMpMatrixDescriptor_t, for the flat bindings.");
    bind_lifetime(md, "cublasMpMatrixDescriptorDestroy. Idempotent.");

    auto mmd = nb::class_<MatmulDescriptor>(m, "MatmulDescriptor", "cublasMpMatmulDescriptor_t.");
    mmd.def("__init__", [](MatmulDescriptor* self, int compute) {
        void* d = nullptr;
        call(api().cublasMpMatmulDescriptorCreate, &d, compute);
        new (self) MatmulDescriptor(std::make_shared<MatmulDescState>(d, compute));
    }, nb::arg("compute_type"))
        .def_prop_ro("compute_type", [](MatmulDescriptor& d) { return d.get().compute; });
    bind_c_pointer(mmd, [](MatmulDescriptor& d) { return d.get().desc; }, nullptr);  // cublasmp.MatmulDescriptor's
    bind_lifetime(mmd, "cublasMpMatmulDescriptorDestroy. Idempotent.");

    auto ws = nb::class_<Workspace>(m, "Workspace", "Device memory from cublasMpMalloc on a grid, registered on "
                                                    "every other grid it serves.");
    ws.def("__init__", [](Workspace* self, nb::handle grid, nb::handle nbytes) {
        Grid& g = object_arg<Grid>(grid, "grid", "a cublasmp.Grid");
        size_t n = uint_arg(nbytes, "nbytes", 1);
        g.get();
        new (self) Workspace(make_workspace(g.state(), n, false));
    }, nb::arg("grid").none(), nb::arg("nbytes").none(), nb::sig("def __init__(self, grid: Grid, nbytes: int) -> None"))
        .def_prop_ro("ptr", [](Workspace& w) { return reinterpret_cast<uintptr_t>(w.get().ptr); })
        .def_prop_ro("nbytes", [](Workspace& w) { return w.get().size; })
        .def("serve", [](Workspace& w, std::vector<Grid*> grids) {
            std::vector<std::shared_ptr<GridState>> gs;
            for (auto* g : grids) {
                g->get();
                gs.push_back(g->state());
            }
            w.get().serve(gs);
        }, nb::arg("grids"), "Register on each of `grids` (collective); on a failure, undo this call's registrations.")
        .def_prop_ro("grids", [](Workspace& w) {
            size_t n = 1 + w.get().served.size();
            return n;
        }, "How many grids it is registered on.");
    bind_lifetime(ws, "Deregister from the grids it serves, then cublasMpFree (collective). Idempotent.");

    m.def("shared_workspace", [](Grid& g, size_t nbytes) {
        g.get();
        return Workspace(shared_workspace(g.state(), nbytes));
    }, nb::arg("grid"), nb::arg("nbytes"),
       "The grid's shared workspace with at least `nbytes` (collective when it must grow); lives until the grid "
       "closes.");

    auto plan = nb::class_<MatmulPlan>(m, "MatmulPlan",
                                       "One cublasMpMatmul with everything fixed; execute() is one library call.");
    plan.def("__init__", [](MatmulPlan* self, Handle& h, MatmulDescriptor& mm, i64 m_, i64 n_, i64 k_,
                            nb::bytes alpha, nb::handle a, nb::handle b, nb::bytes beta, nb::handle c, nb::handle d,
                            nb::object workspace, nb::object keep, bool owns_descriptor) {
        auto p = std::make_shared<MatmulPlanState>();
        h.get();
        mm.get();
        p->handle = h.state();
        p->mm = mm.state();
        p->owns_descriptor = owns_descriptor;
        if (m_ < 0 || n_ < 0 || k_ < 0) raise_usage("m, n, k must be >= 0");
        p->m = m_;
        p->n = n_;
        p->k = k_;
        p->alpha = scalar_bytes(alpha, "alpha");
        p->beta = scalar_bytes(beta, "beta");
        p->a = operand(a, "a", false);
        p->b = operand(b, "b", false);
        p->c = operand(c, "c", true);
        p->d = operand(d, "d", false);
        p->comm().refuse_if_failed();
        p->size_workspaces();
        if (p->device_bytes > 0) {
            if (!workspace.is_none()) {
                auto& w = nb::cast<Workspace&>(workspace);
                if (w.get().size < p->device_bytes) {
                    raise_usage("workspace has " + std::to_string(w.get().size) + " bytes; this matmul needs " +
                                std::to_string(p->device_bytes));
                }
                p->workspace = w.state();
            } else {
                // The grid's shared workspace, grown if needed and registered on every grid involved.
                p->workspace = shared_workspace(p->d.desc->grid, p->device_bytes);
            }
            std::vector<std::shared_ptr<GridState>> grids;
            for (const Operand* o : {&p->a, &p->b, &p->c, &p->d}) {
                if (o->desc) grids.push_back(o->desc->grid);
            }
            p->workspace->serve(grids);
        }
        if (p->host_bytes) p->host_workspace.assign(p->host_bytes, "MatmulPlan's host workspace");
        p->keep = std::move(keep);
        new (self) MatmulPlan(p);
    }, nb::arg("handle"), nb::arg("descriptor"), nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("alpha"),
       nb::arg("a"), nb::arg("b"), nb::arg("beta"), nb::arg("c").none(), nb::arg("d"),
       nb::arg("workspace").none() = nb::none(), nb::arg("keep") = nb::none(),
       nb::arg("owns_descriptor") = false)
        .def("execute", [](MatmulPlan& p, nb::handle stream, nb::handle a, nb::handle b, nb::handle c, nb::handle d) {
            MatmulPlanState& s = p.get();
            MatmulPlanState::Pointers ptrs{};
            if (!(a.is_none() && b.is_none() && c.is_none() && d.is_none())) ptrs = new_operands(s, a, b, c, d);
            s.execute(stream.is_none() ? s.handle->stream : stream_handle(stream), ptrs);
        },
             nb::arg("stream").none() = nb::none(), nb::kw_only(), nb::arg("a").none() = nb::none(),
             nb::arg("b").none() = nb::none(), nb::arg("c").none() = nb::none(), nb::arg("d").none() = nb::none())
        .def("capture", [](MatmulPlan& p, nb::handle stream) {
            MatmulPlanState& s = p.get();
            s.capture(stream.is_none() ? s.handle->stream : stream_handle(stream));
        }, nb::arg("stream").none() = nb::none())
        .def_prop_ro("captured", [](MatmulPlan& p) { return p.state()->graph_exec != nullptr; })
        .def_prop_ro("owns_descriptor", [](MatmulPlan& p) { return p.state()->owns_descriptor; })
        .def_prop_ro("workspace_size", [](MatmulPlan& p) {
            return std::make_tuple(p.get().device_bytes, p.get().host_bytes);
        });
    bind_lifetime(plan, "Drop the plan's references and CUDA graph; close the matmul descriptor when it owns it.");

    // --- launches from a framework's program (mpbind.jax) ---
    m.def("launch_register_matmul", [](nb::handle plan, int device,
                                       std::vector<std::tuple<bool, size_t, size_t>> slots) {
        if (slots.size() != 4) raise_usage("launch_register_matmul: one (used, offset, bytes) per operand a, b, c, d");
        auto l = std::make_shared<MatmulLaunch>();
        l->device = device;
        if (!plan.is_none()) {
            MatmulPlan& mp = nb::cast<MatmulPlan&>(plan);
            MatmulPlanState& p = mp.get();
            p.handle->check_open();
            p.comm().refuse_if_failed();
            if (p.graph_exec) raise_usage("a captured matmul replays its own operands: it cannot be launched");
            l->plan = mp.state();
        }
        const Operand* planned[] = {l->plan ? &l->plan->a : nullptr, l->plan ? &l->plan->b : nullptr,
                                    l->plan ? &l->plan->c : nullptr, l->plan ? &l->plan->d : nullptr};
        for (size_t i = 0; i < 4; ++i) {
            auto [used, offset, nbytes] = slots[i];
            MatmulLaunch::Slot& s = l->slots[i];
            s.used = used;
            s.offset = offset;
            s.bytes = nbytes;
            bool has = planned[i] && planned[i]->desc;
            if (l->plan && used != has) {
                raise_usage(std::string("the plan was made ") + (has ? "with " : "without ") + kOperandNames[i]);
            }
            if (has) {
                size_t extent = piece_extent(*planned[i]->desc);
                if (offset > nbytes || extent > nbytes - offset) {
                    raise_usage(std::string(kOperandNames[i]) + ": its piece (" + std::to_string(extent) +
                                " bytes from offset " + std::to_string(offset) + ") does not lie in " +
                                std::to_string(nbytes) + " bytes");
                }
            }
        }
        static_cast<void>(api());  // the tables a launch calls through (a table loads on first use, with the GIL)
        static_cast<void>(abi::nccl::api());
        return launch::registry<MatmulLaunch>().add(std::move(l));
    }, nb::arg("plan").none(), nb::arg("device"), nb::arg("slots"),
          "Register a planned matmul (None on a rank with nothing to compute) for launches from a framework's "
          "program, with (used, offset, bytes) of the buffer each operand a, b, c, d is given in; its id.");
    m.def("launch_release", [](uint64_t id) { return launch::registry<MatmulLaunch>().take(id); }, nb::arg("id"),
          "Forget a planned matmul's launch id; False when none is registered under it.");
    m.def("launch_matmul", [](uint64_t id, uintptr_t stream, int device, std::vector<uintptr_t> ptrs,
                              std::vector<size_t> nbytes) {
        if (ptrs.size() != 4 || nbytes.size() != 4) raise_usage("launch_matmul: four pointers and four sizes (a, b, c, d)");
        std::array<const void*, 4> p{};
        std::array<size_t, 4> n{};
        for (size_t i = 0; i < 4; ++i) {
            p[i] = reinterpret_cast<const void*>(ptrs[i]);
            n[i] = nbytes[i];
        }
        launch::Status st;
        {
            nb::gil_scoped_release release;  // as a framework's thread calls it
            st = launch::matmul(id, stream, device, p, n);
        }
        return nb::make_tuple(static_cast<int>(st.code), st.message);
    }, nb::arg("id"), nb::arg("stream"), nb::arg("device"), nb::arg("ptrs"), nb::arg("nbytes"),
          "launch::matmul as a framework's handler calls it (GIL released): (status code, message).");

    nb::module_ testing = nb::borrow<nb::module_>(parent.attr("_testing"));
    testing.def("cublasmp_host_workspace", [](size_t nbytes) {
        HostWorkspace w = asked_host_workspace(nbytes);
        return w.data() != nullptr && (w.size() == 0 || w.data()[w.size() - 1] == 0);
    }, nb::arg("nbytes"), "Handle.host_workspace's checks and allocation, without a handle: True once allocated "
       "(zeroed) and freed.");
    testing.def("cublasmp_local_shape", &local_shape, nb::arg("m"), nb::arg("n"), nb::arg("mb"), nb::arg("nb"),
                nb::arg("rsrc"), nb::arg("csrc"), nb::arg("nprow"), nb::arg("npcol"), nb::arg("layout"),
                nb::arg("rank"),
                "(rows, columns) of the local piece MatmulPlan.execute expects of a new operand.");
    testing.def("cublasmp_operand", [](nb::handle array, const char* what, i64 rows, i64 cols, i64 lld,
                                       nb::handle dtype, bool writable) {
        return new_operand(array, what, {rows, cols, lld, arrays::dtype_of(dtype)}, writable);
    }, nb::arg("array").none(), nb::arg("what"), nb::arg("rows"), nb::arg("cols"), nb::arg("lld"), nb::arg("dtype"),
       nb::arg("writable") = false,
       "The checks of a new operand of MatmulPlan.execute against a planned local piece, without cuBLASMp: its "
       "pointer.");
}

}  // namespace mpbind
