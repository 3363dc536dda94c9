// Each part of hcomm._C binds itself in its own translation unit; this is
// the list.  Only csrc/torch/ sources include torch headers.
#pragma once

#include <pybind11/pybind11.h>

#include "core/request.h"

namespace hcomm {
void bind_core(pybind11::module_& m);     // python/bind_core.cpp
void bind_kernels(pybind11::module_& m);  // python/bind_kernels.cpp
void bind_torch(pybind11::module_& m);    // csrc/torch/bind_backend.cpp
pybind11::dict record_to_dict(const OpRecord& record);
void bind_compress(pybind11::module_& m);  // python/bind_compress.cpp
void bind_shm(pybind11::module_& m);       // python/bind_shm.cpp
void bind_stage(pybind11::module_& m);     // python/bind_stage.cpp
}  // namespace hcomm
