// Kernel entry points on numpy-compatible buffers, for tests and benchmarks.
#include <pybind11/pybind11.h>

#include "core/kernels/reduce.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace hcomm {

void bind_kernels(py::module_& m) {
  auto k = m.def_submodule("kernels", "CPU reduction/cast kernels");
  k.def(
      "reduce_into",
      [](py::buffer acc, py::buffer src, int dtype, int op) {
        py::buffer_info a = acc.request(true), s = src.request();
        int64_t n = static_cast<int64_t>(a.size * a.itemsize / dtype_size(static_cast<DType>(dtype)));
        py::gil_scoped_release nogil;
        kernels::reduce_into(a.ptr, s.ptr, n, static_cast<DType>(dtype), static_cast<ReduceOp>(op));
      },
      "acc OP= src elementwise (dtype and op are hcomm enum values)");
}

}  // namespace hcomm
