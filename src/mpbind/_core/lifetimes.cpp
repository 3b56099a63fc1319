// The lifetime table: for every kind of object the core owns, what happens when its last
// reference goes away without close(), whether its release is collective, which kind releases
// it first, and what releases it. States look their row up by kind (State::State); Python reads
// the table through mpbind._core.lifetimes(), and a test checks it against docs/DESIGN.md.

#include <cstring>
#include <stdexcept>
#include <string>

#include "core.hpp"

namespace mpbind {

namespace {

constexpr bool kCollective = true, kLocal = false;
constexpr const char* kNoParent = "";

const std::vector<Lifetime>& library_rows() {
    static const std::vector<Lifetime> rows{
        // kind, drop policy, whether its release is collective, the kind released first by, what releases it
        {"nccl.Communicator", Drop::kQueued, kCollective, kNoParent,
         "ncclCommFinalize (bounded), ncclCommDestroy; ncclCommAbort after abort() or a failure; ncclCommDestroy "
         "alone once quiescent after a revoke"},
        {"nccl.Buffer", Drop::kAtOnce, kLocal, kNoParent, "ncclMemFree"},
        {"nccl.Registration", Drop::kAtOnce, kLocal, "nccl.Communicator", "ncclCommDeregister"},
        {"nccl.Window", Drop::kQueued, kCollective, "nccl.Communicator", "ncclCommWindowDeregister"},

        {"nvshmem.Runtime", Drop::kNever, kCollective, kNoParent, "nvshmemx_hostlib_finalize (finalize())"},
        {"nvshmem.Team", Drop::kQueued, kCollective, "nvshmem.Runtime", "nvshmem_team_destroy"},
        {"nvshmem.Team(predefined)", Drop::kAtOnce, kLocal, "nvshmem.Runtime",
         "nothing (predefined teams are never destroyed)"},
        {"nvshmem.SymmetricMemory", Drop::kQueued, kCollective, "nvshmem.Runtime", "nvshmem_free"},
        {"nvshmem.Registration", Drop::kAtOnce, kLocal, "nvshmem.Runtime", "nvshmemx_buffer_unregister"},
        // Local, but never from the garbage collector: its kernels may still run, and NVSHMEM keeps a
        // pointer into it until nvshmemx_culibrary_finalize (which needs the runtime up: its parent).
        {"nvshmem.KernelLibrary", Drop::kQueued, kLocal, "nvshmem.Runtime",
         "device synchronised, nvshmemx_culibrary_finalize (where registered), cuLibraryUnload"},

        {"cublasmp.Handle", Drop::kAtOnce, kLocal, kNoParent, "cublasMpDestroy"},
        {"cublasmp.Grid", Drop::kByOwner, kCollective, "nccl.Communicator", "cublasMpGridDestroy"},
        {"cublasmp.Registration", Drop::kQueued, kCollective, "cublasmp.Grid", "cublasMpBufferDeregister"},
        {"cublasmp.MatrixDescriptor", Drop::kAtOnce, kLocal, "cublasmp.Grid", "cublasMpMatrixDescriptorDestroy"},
        {"cublasmp.MatmulDescriptor", Drop::kAtOnce, kLocal, kNoParent, "cublasMpMatmulDescriptorDestroy"},
        {"cublasmp.Workspace", Drop::kQueued, kCollective, "cublasmp.Grid",
         "cublasMpBufferDeregister on the grids it serves, cublasMpFree"},
        {"cublasmp.SharedWorkspace", Drop::kByOwner, kCollective, "cublasmp.Grid",
         "cublasMpBufferDeregister on the grids it serves, cublasMpFree"},
        {"cublasmp.MatmulPlan", Drop::kAtOnce, kLocal, kNoParent,
         "cuGraphExecDestroy, cuGraphDestroy (once captured); its descriptor when it owns it"},

        {"cufftmp.Plan", Drop::kQueuedOnceCollective, kCollective, kNoParent, "cufftDestroy"},
        {"cufftmp.Descriptor", Drop::kQueued, kCollective, "cufftmp.Plan", "cufftXtFree"},
        {"cufftmp.Reshape", Drop::kQueuedOnceCollective, kCollective, kNoParent, "cufftMpDestroyReshape"},

        {"mpbind.Composite", Drop::kByParts, kLocal, kNoParent,
         "nothing of its own: close() closes its parts, newest first"},
    };
    return rows;
}

// The library-free doubles of mpbind._core._testing (not listed by lifetimes()).
const std::vector<Lifetime>& testing_rows() {
    static const std::vector<Lifetime> rows{
        {"testing.Owner", Drop::kNever, kLocal, kNoParent, "nothing"},
        {"testing.Resource", Drop::kAtOnce, kLocal, "testing.Owner", "its on_release callback"},
        {"testing.CollectiveResource", Drop::kQueued, kCollective, "testing.Owner", "its on_release callback"},
        {"testing.Registration", Drop::kAtOnce, kLocal, "testing.Owner", "the owner's on_deregister callback"},
        {"testing.CollectiveRegistration", Drop::kQueued, kCollective, "testing.Owner",
         "the owner's on_deregister callback"},
        {"testing.Cached", Drop::kByOwner, kCollective, kNoParent, "nothing (the test cache owns it)"},
    };
    return rows;
}

}  // namespace

const Lifetime& lifetime(const char* kind) {
    for (const auto* rows : {&library_rows(), &testing_rows()}) {
        for (const Lifetime& row : *rows) {
            if (std::strcmp(row.kind, kind) == 0) return row;
        }
    }
    throw std::logic_error(std::string("no row for ") + kind + " in the lifetime table (lifetimes.cpp)");
}

const std::vector<Lifetime>& lifetimes() { return library_rows(); }

const char* drop_name(Drop drop) {
    switch (drop) {
        case Drop::kAtOnce: return "at_once";
        case Drop::kQueued: return "queued";
        case Drop::kQueuedOnceCollective: return "queued_once_collective";
        case Drop::kByOwner: return "by_owner";
        case Drop::kNever: return "never";
        case Drop::kByParts: return "by_parts";
    }
    return "?";
}

}  // namespace mpbind
