#pragma once
/// NVTX ranges in an "ncclkit" domain, so that Nsight Systems shows which ncclkit call issued
/// which kernels (collectives, and GradientSync's launches, casts and copies). NVTX 3 is
/// header-only (part of the CUDA toolkit); without a profiler attached a range costs a load and
/// a branch. Where the header is not on the include path (a host-only build with g++ alone, for
/// Gloo) or NCCLKIT_DISABLE_NVTX is defined, ranges compile to nothing, so host-only code never
/// needs CUDA.

#include <cstdint>  // std::uint64_t

#if !defined(NCCLKIT_DISABLE_NVTX) && __has_include(<nvtx3/nvToolsExt.h>)
#define NCCLKIT_HAVE_NVTX 1
#include <nvtx3/nvToolsExt.h>  // nvtxDomainCreateA, nvtxDomainRangePushEx, nvtxDomainRangePop
#endif

namespace ncclkit::detail {

#ifdef NCCLKIT_HAVE_NVTX
inline nvtxDomainHandle_t nvtx_domain() {
  static nvtxDomainHandle_t domain = nvtxDomainCreateA("ncclkit");
  return domain;
}
#endif

#ifdef NCCLKIT_HAVE_NVTX
/// Pushes a range named `name` (a string literal) with `payload` as its value (a bucket or
/// chunk number); nvtxDomainRangePop(nvtx_domain()) ends it.
inline void nvtx_push(const char* name, std::uint64_t payload) {
  nvtxEventAttributes_t attributes{};
  attributes.version = NVTX_VERSION;
  attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attributes.message.ascii = name;
  attributes.payloadType = NVTX_PAYLOAD_TYPE_UNSIGNED_INT64;
  attributes.payload.ullValue = payload;
  nvtxDomainRangePushEx(nvtx_domain(), &attributes);
}
#endif

/// Pushes a range named `name` (a string literal) for the scope; `payload`, when given, shows
/// as the range's value in Nsight (a bucket or chunk number), so no string is formatted.
class NvtxRange {
 public:
#ifdef NCCLKIT_HAVE_NVTX
  explicit NvtxRange(const char* name) { push(name, nullptr); }
  NvtxRange(const char* name, std::uint64_t payload) { push(name, &payload); }
  ~NvtxRange() { nvtxDomainRangePop(nvtx_domain()); }
#else
  explicit NvtxRange(const char*) {}
  NvtxRange(const char*, std::uint64_t) {}
#endif
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;

 private:
#ifdef NCCLKIT_HAVE_NVTX
  static void push(const char* name, const std::uint64_t* payload) {
    nvtxEventAttributes_t attributes{};
    attributes.version = NVTX_VERSION;
    attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
    attributes.message.ascii = name;
    if (payload != nullptr) {
      attributes.payloadType = NVTX_PAYLOAD_TYPE_UNSIGNED_INT64;
      attributes.payload.ullValue = *payload;
    }
    nvtxDomainRangePushEx(nvtx_domain(), &attributes);
  }
#endif
};

/// An NvtxRange where `kOn`, nothing otherwise: generic code annotates device backends only
/// (`NvtxRangeIf<B::memory_kind == MemoryKind::kDevice>`), whose work Nsight shows.
template <bool kOn>
class NvtxRangeIf : public NvtxRange {
 public:
  using NvtxRange::NvtxRange;
};
template <>
class NvtxRangeIf<false> {
 public:
  explicit NvtxRangeIf(const char*) {}
  NvtxRangeIf(const char*, std::uint64_t) {}
};

}  // namespace ncclkit::detail
