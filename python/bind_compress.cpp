// hcomm._C.compress: the wire codec (core/compress) on raw pointers, for
// hcomm/compress.py and the simulated tests.  Residuals are bound as
// objects so Python can hold a buffer's error-feedback state.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>

#include "core/compress/codec.h"
#include "core/compress/residual_store.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace hcomm {

void bind_compress(py::module_& m) {
  using compress::Residual;
  using compress::ResidualStore;
  using compress::WireFormat;
  auto c = m.def_submodule("compress", "wire compression for the weak tier");
  auto fmt = [](int wire, int64_t chunk) { return WireFormat{static_cast<DType>(wire), chunk}; };

  py::class_<Residual, std::shared_ptr<Residual>>(c, "Residual")
      .def(py::init<>())
      .def_property_readonly("size", &Residual::size)
      .def("reset", &Residual::reset)
      .def("values", [](Residual& r) {
        // A copy, for tests and diagnostics.
        float* p = r.data(r.size());
        return std::vector<float>(p, p + r.size());
      });
  py::class_<ResidualStore, std::shared_ptr<ResidualStore>>(c, "ResidualStore")
      .def(py::init<>())
      .def("get", &ResidualStore::get, py::arg("group"), py::arg("buffer_id"))
      .def("clear", &ResidualStore::clear, py::arg("group"))
      .def("clear_all", &ResidualStore::clear_all)
      .def("__len__", &ResidualStore::size);

  c.def("encoded_bytes", [fmt](int64_t n, int wire, int64_t chunk) { return compress::encoded_bytes(n, fmt(wire, chunk)); },
        py::arg("n"), py::arg("wire"), py::arg("chunk"));
  c.def(
      "encode_ptr",
      [fmt](uintptr_t src, int sd, int64_t n, int wire, int64_t chunk, uintptr_t out, std::shared_ptr<Residual> ef) {
        py::gil_scoped_release nogil;
        compress::encode(reinterpret_cast<const void*>(src), static_cast<DType>(sd), n, fmt(wire, chunk),
                         reinterpret_cast<void*>(out), ef.get());
      },
      py::arg("src"), py::arg("src_dtype"), py::arg("n"), py::arg("wire"), py::arg("chunk"), py::arg("out"),
      py::arg("residual") = nullptr);
  c.def(
      "decode_ptr",
      [fmt](uintptr_t in, int64_t n, int wire, int64_t chunk, uintptr_t dst, int dd) {
        py::gil_scoped_release nogil;
        compress::decode(reinterpret_cast<const void*>(in), n, fmt(wire, chunk), reinterpret_cast<void*>(dst),
                         static_cast<DType>(dd));
      },
      py::arg("wire_buf"), py::arg("n"), py::arg("wire"), py::arg("chunk"), py::arg("dst"), py::arg("dst_dtype"));
  c.def(
      "decode_accumulate_ptr",
      [fmt](uintptr_t in, int64_t n, int wire, int64_t chunk, uintptr_t acc, int ad, int op) {
        py::gil_scoped_release nogil;
        compress::decode_accumulate(reinterpret_cast<const void*>(in), n, fmt(wire, chunk),
                                    reinterpret_cast<void*>(acc), static_cast<DType>(ad), static_cast<ReduceOp>(op));
      },
      py::arg("wire_buf"), py::arg("n"), py::arg("wire"), py::arg("chunk"), py::arg("acc"), py::arg("acc_dtype"),
      py::arg("op"));
}

}  // namespace hcomm
