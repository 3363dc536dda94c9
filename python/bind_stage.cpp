// The copy engines of the host-staged bridge, for tests and the GPU script:
// one chunked device -> host block -> device trip, timed per direction.
#include <pybind11/pybind11.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/stage/copy_engine.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace hcomm {
namespace {

// src (device memory) -> staging block -> dst (device memory), `chunk` bytes
// at a time: chunk k goes down as soon as it is up, so the directions
// overlap as in the bridge.  `stream`: the caller's stream handle the copies
// are ordered after (0: the default stream).  Returns (seconds, engine name).
py::tuple stage_copy(int device, uintptr_t src, uintptr_t dst, int64_t bytes, int64_t chunk, uintptr_t stream) {
  HCOMM_CHECK_ARG(device >= 0 && device <= static_cast<int>(DeviceKind::kNPU), "hcomm: unknown device kind");
  HCOMM_CHECK_ARG(bytes >= 0 && chunk > 0, "hcomm: stage_copy needs bytes >= 0 and chunk > 0");
  auto engine = stage::engine_for(static_cast<DeviceKind>(device));
  HCOMM_CHECK_ARG(engine != nullptr, std::string("hcomm: this build has no copy engine for ") +
                                         stage::device_name(static_cast<DeviceKind>(device)) + " memory");
  double seconds = 0;
  {
    py::gil_scoped_release nogil;
    stage::HostBlock block = engine->host_block(static_cast<size_t>(bytes));
    const auto t0 = std::chrono::steady_clock::now();
    engine->after_stream(reinterpret_cast<void*>(stream));
    std::vector<stage::Ticket> up;
    for (int64_t at = 0; at < bytes; at += chunk) {
      const int64_t n = std::min(chunk, bytes - at);
      up.push_back(engine->to_host(block.data() + at, reinterpret_cast<const char*>(src) + at, n));
    }
    stage::Ticket down;
    size_t k = 0;
    for (int64_t at = 0; at < bytes; at += chunk, ++k) {
      engine->wait(up[k]);
      down = engine->to_device(reinterpret_cast<char*>(dst) + at, block.data() + at, std::min(chunk, bytes - at));
    }
    engine->wait(down);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return py::make_tuple(seconds, std::string(engine->name()));
}

}  // namespace

void bind_stage(py::module_& m) {
  m.def("stage_copy", &stage_copy, py::arg("device"), py::arg("src"), py::arg("dst"), py::arg("bytes"),
        py::arg("chunk") = 1 << 20, py::arg("stream") = 0,
        "Copy `bytes` from src to dst (device addresses) through a host staging block in chunks with the "
        "copy engine of `device` (0 cpu: the staging mode's, 1 cuda); returns (seconds, engine name).");
}

}  // namespace hcomm
