#pragma once
/// `NvtxObserver<B>`: a GradientSync observer (fusion/observer.hpp) that shows the sync's work in
/// Nsight Systems as NVTX ranges of the "ncclkit" domain (core/detail/nvtx.hpp), one per phase
/// as the host issues it ("GradientSync.pack", ".encode", ".all_reduce", ".decode", ...), its
/// bucket or piece as the payload. Made for device backends where NVTX is on the include path;
/// without a profiler attached a range costs a load and a branch.

#include <cstddef>  // std::size_t
#include <memory>   // std::unique_ptr

#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/detail/nvtx.hpp"
#include "ncclkit/fusion/observer.hpp"

namespace ncclkit::fusion::detail {

template <Backend B>
class NvtxObserver final : public SyncObserver<B> {
 public:
  using Stream = typename B::Stream;

  /// An observer where NVTX ranges mean something (a device backend, NVTX available), else null.
  static std::unique_ptr<SyncObserver<B>> make() {
#ifdef NCCLKIT_HAVE_NVTX
    if constexpr (B::memory_kind == MemoryKind::kDevice) return std::make_unique<NvtxObserver>();
#endif
    return nullptr;
  }

  void on_phase(Phase phase, std::size_t index, bool end, Stream) override {
    if (phase == Phase::kBackward || phase == Phase::kReady) return;  // not host work
#ifdef NCCLKIT_HAVE_NVTX
    if (end) {
      nvtxDomainRangePop(ncclkit::detail::nvtx_domain());
      return;
    }
    static constexpr const char* kNames[kPhaseCount] = {
        "",  "", "GradientSync.pack", "GradientSync.encode", "GradientSync.all_reduce", "GradientSync.count",
        "GradientSync.rerun", "GradientSync.decode", "GradientSync.unpack", "GradientSync.all_gather"};
    ncclkit::detail::nvtx_push(kNames[static_cast<std::size_t>(phase)], index);
#else
    (void)index, (void)end;
#endif
  }
};

}  // namespace ncclkit::fusion::detail
