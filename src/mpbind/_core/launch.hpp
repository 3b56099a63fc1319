// The layer's work launched by a framework's compiled program (the XLA FFI handlers of mpbind.jax)
// on the framework's stream.
//
// A launch runs on a thread of the framework that may not hold the GIL, while the Python thread that
// started the program may hold it: nothing here touches Python or waits for it. The objects are
// registered beforehand, outside the program, under the GIL (a communicator, a made FFT or reshape
// plan, a planned matmul), each under an id the program carries as an attribute; a launch looks its
// object up, checks what it is given against it (sizes, dtype, device, health), calls the libraries
// through the raw entry points of the core's tables and returns what failed as a Status, never
// raising. Each kind of object keeps its registry in its own module (nccl.cpp, cufftmp.cpp,
// cublasmp.cpp); ids are unique across them.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace mpbind::launch {

// What a launch returns: kOk, or why not (the framework's error class follows the code).
struct Status {
    // kInterrupted: a signal handler raised (Ctrl-C) while an interruptible launch waited; the
    // exception is pending on the calling thread.
    enum Code { kOk = 0, kInvalid, kAborted, kTimeout, kFailed, kInterrupted };
    Code code = kOk;
    std::string message;

    bool ok() const { return code == kOk; }
    static Status invalid(std::string m) { return {kInvalid, std::move(m)}; }
    static Status failed(std::string m) { return {kFailed, std::move(m)}; }
};

// The collectives a program may launch on a registered communicator. The element counts follow
// from the buffers' bytes: all_reduce and all_to_all keep the size, all_gather multiplies it by the
// number of ranks, reduce_scatter divides it.
enum class Collective { kAllReduce = 0, kAllGather, kReduceScatter, kAllToAll };

// The bytes of one element of each ncclDataType_t (ncclInt8 .. ncclFloat8e5m2).
inline constexpr int kNcclTypeSizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
// The name of each ncclRedOp_t mpbind takes by name (ncclSum .. ncclAvg), as the layer and the torch
// functions spell them.
inline constexpr const char* kNcclRedOpNames[] = {"sum", "prod", "max", "min", "avg"};

// `dtype` is an ncclDataType_t, `op` an ncclRedOp_t (sum .. avg; ignored by gathers and all-to-all).
// `interruptible`: called from a Python thread that released the GIL, which a wait for a
// non-blocking communicator's launch takes back now and then to run the signal handlers (Ctrl-C ends
// it as its deadline would: the communicator is aborted).
Status collective(uint64_t comm, Collective kind, uintptr_t stream, int device, const void* send,
                  size_t send_bytes, void* recv, size_t recv_bytes, int dtype, int op, bool interruptible = false);
// `in` (this rank's input piece of `direction`, packed) transformed into `out` (its output piece,
// packed): one copy into the plan's buffer, the transform, one copy out.
Status fft(uint64_t plan, uintptr_t stream, int device, const void* in, size_t in_bytes, void* out,
           size_t out_bytes, int direction);
// `in` (this rank's input piece, packed) moved into the output distribution's piece `out`.
Status reshape(uint64_t plan, uintptr_t stream, int device, const void* in, size_t in_bytes, void* out,
               size_t out_bytes);

// A registered planned matmul on `ptrs` (a, b, c, d: the buffers of `bytes` each, nullptr and 0 for
// an operand the plan has none of), queued on `stream`.
Status matmul(uint64_t plan, uintptr_t stream, int device, const std::array<const void*, 4>& ptrs,
              const std::array<size_t, 4>& bytes);

// A new id (never 0, never reused).
inline uint64_t new_id() {
    static std::atomic<uint64_t> next{1};
    return next.fetch_add(1);
}

// Registered objects of one kind by id. add() and take() run under the GIL, find() on any thread.
// An entry may hold Python references (through the core's states), so it is only ever destroyed
// under the GIL: one taken out is retired, and dropped by a later add() or take() once no launch
// holds it any more. The map is never destroyed (nor, then, anything in it after the interpreter).
template <class T>
class Registry {
public:
    uint64_t add(std::shared_ptr<T> entry) {
        uint64_t id = new_id();
        std::vector<std::shared_ptr<T>> dropped;
        std::lock_guard<std::mutex> g(mu_);
        sweep(dropped);
        map_.emplace(id, std::move(entry));
        return id;
    }
    std::shared_ptr<T> find(uint64_t id) const {
        std::lock_guard<std::mutex> g(mu_);
        auto it = map_.find(id);
        return it == map_.end() ? nullptr : it->second;
    }
    // Whether an entry was registered under `id`; it is retired.
    bool take(uint64_t id) {
        std::vector<std::shared_ptr<T>> dropped;  // destroyed after the lock is let go
        std::lock_guard<std::mutex> g(mu_);
        auto it = map_.find(id);
        if (it == map_.end()) return false;
        retired_.push_back(std::move(it->second));
        map_.erase(it);
        sweep(dropped);
        return true;
    }

private:
    void sweep(std::vector<std::shared_ptr<T>>& dropped) {
        for (size_t i = retired_.size(); i-- > 0;) {
            if (retired_[i].use_count() == 1) {
                dropped.push_back(std::move(retired_[i]));
                retired_.erase(retired_.begin() + static_cast<std::ptrdiff_t>(i));
            }
        }
    }
    mutable std::mutex mu_;
    std::unordered_map<uint64_t, std::shared_ptr<T>> map_;
    std::vector<std::shared_ptr<T>> retired_;
};

template <class T>
Registry<T>& registry() {
    static auto* r = new Registry<T>();  // leaked on purpose: see Registry
    return *r;
}

// "no <what> is registered under id N ...": a launch naming an id nobody registered (or released).
inline Status unknown(const char* what, uint64_t id) {
    return Status::invalid(std::string("no ") + what + " is registered under id " + std::to_string(id) +
                           " (register it outside the compiled program, on every rank, and keep it open)");
}

}  // namespace mpbind::launch
