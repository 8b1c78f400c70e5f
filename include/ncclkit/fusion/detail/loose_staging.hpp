#pragma once
/// How a `GradientSync` stages loose tensors (gradients in allocations of the caller's own, a
/// pointer per slot) through its fused buffer: per bucket one batched copy that packs the
/// bucket's loose tensors into the buffer before its reduction, and one that unpacks them after
/// (the backend's copy_batch: one kernel on GPUs). A bucket whose reducer reduces its one loose
/// tensor where it lives needs neither.

#include <cstddef>  // std::size_t, std::byte
#include <vector>   // std::vector

#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/tensor.hpp"
#include "ncclkit/fusion/bucket_plan.hpp"
#include "ncclkit/fusion/layout.hpp"
#include "ncclkit/fusion/reducer.hpp"

namespace ncclkit::fusion::detail {

template <Backend B>
class LooseStaging {
 public:
  /// The batches for `plan`, whose buckets `reducer` reduces, over the fused buffer `buffer`
  /// (its allocation of each type by DataType's value) and the caller's `loose` pointers (one
  /// per slot, null where the tensor lives in the buffer; empty: none).
  LooseStaging(B& backend, const FusedLayout& layout, const std::byte* const* buffer, const std::vector<void*>& loose,
               const BucketPlan& plan, const BucketReducer<B>& reducer) {
    if (loose.empty()) return;
    pack_.resize(plan.size());
    unpack_.resize(plan.size());
    bool any = false;
    for (std::size_t b = 0; b < plan.size(); ++b) {
      if (reducer.reduces_in_place(b)) continue;
      std::vector<CopyItem> in, out;
      for (Slot slot : plan[b].slots) {
        void* user = loose[slot.index];
        if (user == nullptr) continue;
        void* staged = const_cast<std::byte*>(buffer[static_cast<std::size_t>(layout.dtype(slot))]) +
                       layout.offset_bytes(slot);
        in.push_back({staged, user, layout.bytes(slot)});
        out.push_back({user, staged, layout.bytes(slot)});
      }
      if (in.empty()) continue;
      any = true;
      pack_[b] = backend.prepare_copies(in);
      unpack_[b] = backend.prepare_copies(out);
    }
    if (!any) pack_.clear(), unpack_.clear();
  }

  /// Whether any bucket stages loose tensors.
  bool any() const { return !pack_.empty(); }
  /// Whether bucket `b` does.
  bool stages(std::size_t b) const { return !pack_.empty() && pack_[b].size() != 0; }
  const typename B::CopyBatch& pack(std::size_t b) const { return pack_[b]; }
  const typename B::CopyBatch& unpack(std::size_t b) const { return unpack_[b]; }

 private:
  std::vector<typename B::CopyBatch> pack_;  // per bucket (empty where no loose tensor), or none
  std::vector<typename B::CopyBatch> unpack_;
};

}  // namespace ncclkit::fusion::detail
