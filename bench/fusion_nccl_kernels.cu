// fusion_nccl's CUDA kernels: the codec's casts and the batched copy of loose tensors
// (ncclkit/nccl/kernels.cuh registers them for the host code of fusion_nccl.cpp). A program
// that uses the NCCL backend's element-wise work needs one file like this, compiled by nvcc.
#include "ncclkit/nccl/kernels.cuh"
