// hcomm._C: thin bindings over the C++ core and the torch backend.
#include "python/bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "hcomm C++ core";
  hcomm::bind_core(m);
  hcomm::bind_kernels(m);
  hcomm::bind_torch(m);
  hcomm::bind_compress(m);
  hcomm::bind_shm(m);
  hcomm::bind_stage(m);
}
