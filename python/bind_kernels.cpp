// hcomm._C.kernels: the core's kernels on raw pointers, for hcomm/kernels.py
// (which passes torch tensors' data_ptr()), tests and benchmarks.  Pointers
// are plain ints so this file needs no torch headers; dtype and op are the
// hcomm enum values from core/types.h.  The GIL is released around every
// kernel.  CUDA entry points (has_cuda == True builds only) take device
// pointers and the cudaStream_t as an int
// (torch.cuda.current_stream().cuda_stream).
#include <pybind11/pybind11.h>

#include <cstdint>

#include "core/kernels/cast.h"
#include "core/kernels/isa.h"
#include "core/kernels/quantize.h"
#include "core/kernels/reduce.h"
#include "core/kernels/threads.h"
#if defined(HCOMM_WITH_CUDA)
#include "core/kernels/cuda/launch.h"
#endif
#include "python/bindings.h"

namespace py = pybind11;

namespace hcomm {
namespace {

template <typename T = void>
T* ptr(uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

DType dt(int d) { return static_cast<DType>(d); }
ReduceOp rop(int op) { return static_cast<ReduceOp>(op); }

void bind_cuda(py::module_& k) {
#if defined(HCOMM_WITH_CUDA)
  k.attr("has_cuda") = true;
  k.def("cuda_reduce_into", [](uintptr_t acc, uintptr_t src, int64_t n, int dtype, int op, uintptr_t stream) {
    py::gil_scoped_release nogil;
    kernels::cuda_reduce_into(ptr(acc), ptr(src), n, dt(dtype), rop(op), ptr(stream));
  });
  k.def("cuda_cast", [](uintptr_t src, int sd, uintptr_t dst, int dd, int64_t n, uintptr_t stream) {
    py::gil_scoped_release nogil;
    kernels::cuda_cast(ptr(src), dt(sd), ptr(dst), dt(dd), n, ptr(stream));
  });
  k.def("cuda_quantize_fp8",
        [](uintptr_t src, int sd, int64_t n, int fmt, int64_t chunk, uintptr_t q, uintptr_t scales, uintptr_t stream) {
          py::gil_scoped_release nogil;
          kernels::cuda_quantize_fp8(ptr(src), dt(sd), n, dt(fmt), chunk, ptr(q), ptr<float>(scales), ptr(stream));
        });
  k.def("cuda_dequantize_fp8",
        [](uintptr_t q, uintptr_t scales, int64_t n, int fmt, int64_t chunk, uintptr_t dst, int dd, uintptr_t stream) {
          py::gil_scoped_release nogil;
          kernels::cuda_dequantize_fp8(ptr(q), ptr<const float>(scales), n, dt(fmt), chunk, ptr(dst), dt(dd),
                                       ptr(stream));
        });
  k.def("cuda_dequantize_accumulate", [](uintptr_t q, uintptr_t scales, int64_t n, int fmt, int64_t chunk,
                                         uintptr_t acc, int ad, int op, uintptr_t stream) {
    py::gil_scoped_release nogil;
    kernels::cuda_dequantize_accumulate(ptr(q), ptr<const float>(scales), n, dt(fmt), chunk, ptr(acc), dt(ad), rop(op),
                                        ptr(stream));
  });
#else
  k.attr("has_cuda") = false;
#endif
}

}  // namespace

void bind_kernels(py::module_& m) {
  auto k = m.def_submodule("kernels", "CPU (and, in CUDA builds, GPU) reduce/cast/fp8 kernels");
  k.def(
      "reduce_into",
      [](py::buffer acc, py::buffer src, int dtype, int op) {
        py::buffer_info a = acc.request(true), s = src.request();
        int64_t n = static_cast<int64_t>(a.size * a.itemsize / dtype_size(static_cast<DType>(dtype)));
        py::gil_scoped_release nogil;
        kernels::reduce_into(a.ptr, s.ptr, n, static_cast<DType>(dtype), static_cast<ReduceOp>(op));
      },
      "acc OP= src elementwise on buffer-protocol objects (dtype and op are hcomm enum values)");
  k.def(
      "reduce_into_ptr",
      [](uintptr_t acc, uintptr_t src, int64_t n, int dtype, int op) {
        py::gil_scoped_release nogil;
        kernels::reduce_into(ptr(acc), ptr(src), n, dt(dtype), rop(op));
      },
      py::arg("acc"), py::arg("src"), py::arg("n"), py::arg("dtype"), py::arg("op"));
  k.def(
      "reduce_into_cast_ptr",
      [](uintptr_t acc, int ad, uintptr_t src, int sd, int64_t n, int op) {
        py::gil_scoped_release nogil;
        kernels::reduce_into_cast(ptr(acc), dt(ad), ptr(src), dt(sd), n, rop(op));
      },
      py::arg("acc"), py::arg("acc_dtype"), py::arg("src"), py::arg("src_dtype"), py::arg("n"), py::arg("op"));
  k.def(
      "divide_by_ptr",
      [](uintptr_t data, int64_t n, int dtype, int64_t divisor) {
        py::gil_scoped_release nogil;
        kernels::divide_by(ptr(data), n, dt(dtype), divisor);
      },
      py::arg("data"), py::arg("n"), py::arg("dtype"), py::arg("divisor"));
  k.def(
      "cast_ptr",
      [](uintptr_t src, int sd, uintptr_t dst, int dd, int64_t n) {
        py::gil_scoped_release nogil;
        kernels::cast(ptr(src), dt(sd), ptr(dst), dt(dd), n);
      },
      py::arg("src"), py::arg("src_dtype"), py::arg("dst"), py::arg("dst_dtype"), py::arg("n"));
  k.def(
      "quantize_fp8_ptr",
      [](uintptr_t src, int sd, int64_t n, int fmt, int64_t chunk, uintptr_t q, uintptr_t scales) {
        py::gil_scoped_release nogil;
        kernels::quantize_fp8(ptr(src), dt(sd), n, dt(fmt), chunk, ptr<uint8_t>(q), ptr<float>(scales));
      },
      py::arg("src"), py::arg("src_dtype"), py::arg("n"), py::arg("fmt"), py::arg("chunk"), py::arg("q"),
      py::arg("scales"));
  k.def(
      "dequantize_fp8_ptr",
      [](uintptr_t q, uintptr_t scales, int64_t n, int fmt, int64_t chunk, uintptr_t dst, int dd) {
        py::gil_scoped_release nogil;
        kernels::dequantize_fp8(ptr<const uint8_t>(q), ptr<const float>(scales), n, dt(fmt), chunk, ptr(dst), dt(dd));
      },
      py::arg("q"), py::arg("scales"), py::arg("n"), py::arg("fmt"), py::arg("chunk"), py::arg("dst"),
      py::arg("dst_dtype"));
  k.def(
      "dequantize_accumulate_ptr",
      [](uintptr_t q, uintptr_t scales, int64_t n, int fmt, int64_t chunk, uintptr_t acc, int ad, int op) {
        py::gil_scoped_release nogil;
        kernels::dequantize_accumulate(ptr<const uint8_t>(q), ptr<const float>(scales), n, dt(fmt), chunk, ptr(acc),
                                       dt(ad), rop(op));
      },
      py::arg("q"), py::arg("scales"), py::arg("n"), py::arg("fmt"), py::arg("chunk"), py::arg("acc"),
      py::arg("acc_dtype"), py::arg("op"));
  k.def("active_isa", [] { return std::string(kernels::isa_name(kernels::active_isa())); },
        "the ISA the next call will use (HCOMM_KERNEL_ISA, capped by the CPU)");
  k.def("best_isa", [] { return std::string(kernels::isa_name(kernels::best_isa())); });
  k.def("isa_supported", [](const std::string& name) {
    for (auto isa : {kernels::Isa::kPortable, kernels::Isa::kAvx2, kernels::Isa::kAvx512})
      if (name == kernels::isa_name(isa)) return kernels::isa_supported(isa);
    return false;
  });
  k.def("kernel_threads", &kernels::kernel_threads);
  k.attr("parallel_min_bytes") = kernels::kParallelMinBytes;
  bind_cuda(k);
}

}  // namespace hcomm
