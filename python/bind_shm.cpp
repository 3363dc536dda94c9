// Bindings of the shared-memory transport: its setup steps, which Python
// sequences around store barriers (hcomm/shm.py), and blocking send/recv on
// buffer-protocol objects so its message semantics can be tested directly.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>

#include "core/shm/shm_transport.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace hcomm {

namespace {
Buffer bytes_of(py::buffer obj, bool writable) {
  py::buffer_info info = obj.request(writable);
  Buffer b;
  b.data = info.ptr;
  b.dtype = DType::kUInt8;
  b.count = static_cast<int64_t>(info.size * info.itemsize);
  return b;
}
}  // namespace

void bind_shm(py::module_& m) {
  // The vendor-library interface, so ProcessGroupHComm.set_hierarchy can take
  // any transport built here as an island's intra transport.
  py::class_<Transport, std::shared_ptr<Transport>>(m, "Transport")
      .def_property_readonly("library", &Transport::library);
  py::class_<ShmTransport, Transport, std::shared_ptr<ShmTransport>>(m, "ShmTransport")
      .def(py::init<std::string, int, int, std::chrono::milliseconds, size_t>(), py::arg("name"), py::arg("rank"),
           py::arg("size"), py::arg("timeout"), py::arg("ring_bytes"),
           "Creates and maps this rank's region /dev/shm/<name>-<rank>.")
      .def("connect", &ShmTransport::connect, py::call_guard<py::gil_scoped_release>(),
           "Maps every peer's region (all ranks must have created theirs) and starts the threads.")
      .def("unlink", &ShmTransport::unlink, "Removes this rank's name from /dev/shm; mappings stay valid.")
      .def_property_readonly("rank", &ShmTransport::rank)
      .def_property_readonly("size", &ShmTransport::size)
      .def_property_readonly("ring_bytes", &ShmTransport::ring_bytes)
      .def("set_timeout", &ShmTransport::set_timeout, py::arg("timeout"))
      .def(
          "send",
          [](ShmTransport& t, py::buffer data, int peer, int tag) {
            Buffer b = bytes_of(data, false);
            py::gil_scoped_release nogil;
            t.isend(b, peer, tag)->wait();
          },
          py::arg("data"), py::arg("peer"), py::arg("tag") = 0)
      .def(
          "recv",
          [](ShmTransport& t, py::buffer out, int peer, int tag) {
            Buffer b = bytes_of(out, true);
            py::gil_scoped_release nogil;
            auto p = t.irecv(b, peer, tag);
            p->wait();
            return p->source();
          },
          py::arg("out"), py::arg("peer"), py::arg("tag") = 0,
          "Receives exactly len(out) bytes from `peer` (-1: any); returns the source rank.");
}

}  // namespace hcomm
