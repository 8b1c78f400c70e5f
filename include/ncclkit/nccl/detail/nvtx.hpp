#pragma once
/// NVTX ranges around collectives, in an "ncclkit" domain, so that Nsight Systems shows which
/// ncclkit call issued which NCCL kernels. NVTX 3 is header-only (part of the CUDA toolkit);
/// without a profiler attached a range costs a load and a branch.

#include <nvtx3/nvToolsExt.h>  // nvtxDomainCreateA, nvtxDomainRangePushEx, nvtxDomainRangePop

namespace ncclkit::nccl::detail {

inline nvtxDomainHandle_t nvtx_domain() {
  static nvtxDomainHandle_t domain = nvtxDomainCreateA("ncclkit");
  return domain;
}

/// Pushes a range named `name` (a string literal) for the scope.
class NvtxRange {
 public:
  explicit NvtxRange(const char* name) {
    nvtxEventAttributes_t attributes{};
    attributes.version = NVTX_VERSION;
    attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
    attributes.message.ascii = name;
    nvtxDomainRangePushEx(nvtx_domain(), &attributes);
  }
  ~NvtxRange() { nvtxDomainRangePop(nvtx_domain()); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace ncclkit::nccl::detail
