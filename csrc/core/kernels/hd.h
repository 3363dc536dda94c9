// HCOMM_HD marks the scalar conversions that CPU and CUDA code share
// (half.h, fp8.h): __host__ __device__ under nvcc, plain inline elsewhere.
#pragma once

#if defined(__CUDACC__)
#define HCOMM_HD __host__ __device__ __forceinline__
#else
#define HCOMM_HD inline
#endif
