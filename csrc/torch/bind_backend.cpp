// Python bindings of ProcessGroupHComm (needs torch's pybind type casters,
// hence it lives in csrc/torch/).
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include <cmath>

#include "core/error.h"
#include "python/bindings.h"
#include "torch/device_uneven.h"
#include "torch/process_group.h"
#include "torch/tensor_util.h"

namespace py = pybind11;

namespace hcomm {

namespace {
CollectiveArgs plan_args(ProcessGroupHComm& pg, const std::string& op, int dtype, int64_t count, int reduce) {
  CollectiveArgs a;
  bool found = false;
  for (int i = 0; i < static_cast<int>(OpKind::kCount); ++i)
    if (op == op_name(static_cast<OpKind>(i))) a.kind = static_cast<OpKind>(i), found = true;
  if (!found) throw Error(ErrorKind::kInvalidArgument, "hcomm: unknown op '" + op + "'");
  const int n = pg.getSize();
  a.input.dtype = a.output.dtype = static_cast<DType>(dtype);
  a.reduce = static_cast<ReduceOp>(reduce);
  a.input.count = a.output.count = count;  // `count` is the per-rank payload in elements
  switch (a.kind) {
    case OpKind::kAllGather:
    case OpKind::kAllGatherV:
    case OpKind::kGather: a.output.count = count * n; break;
    case OpKind::kReduceScatter:
    case OpKind::kReduceScatterV:
    case OpKind::kScatter: a.input.count = count * n; break;
    default: break;
  }
  if (a.kind == OpKind::kAllGatherV) a.output_counts.assign(n, count);
  if (a.kind == OpKind::kReduceScatterV) a.input_counts.assign(n, count);
  if (a.kind == OpKind::kAllToAllV) a.input_counts = a.output_counts = even_counts(count, n);
  return a;
}
}  // namespace

void bind_torch(py::module_& m) {
  py::module_::import("torch.distributed");
  py::class_<ProcessGroupHComm, c10d::Backend, c10::intrusive_ptr<ProcessGroupHComm>>(m, "ProcessGroupHComm")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, c10::intrusive_ptr<c10d::Backend> host,
                       std::optional<c10::intrusive_ptr<c10d::Backend>> device, std::string algorithm, bool debug,
                       double alpha, double beta) {
             CommConfig cfg;
             cfg.forced_algorithm = algorithm;
             cfg.debug_checks = debug;
             cfg.flat_link.alpha = alpha;
             cfg.flat_link.beta = beta;
             return c10::make_intrusive<ProcessGroupHComm>(store, rank, size, timeout, host,
                                                           device ? *device : c10::intrusive_ptr<c10d::Backend>(), cfg);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("host_backend"),
           py::arg("device_backend") = py::none(), py::arg("algorithm") = "", py::arg("debug") = false,
           py::arg("alpha") = 50e-6, py::arg("beta") = 1e9, py::call_guard<py::gil_scoped_release>())
      .def("all_gather_v", &ProcessGroupHComm::all_gather_v, py::arg("output"), py::arg("input"), py::arg("counts"),
           py::call_guard<py::gil_scoped_release>())
      .def(
          "reduce_scatter_v",
          [](ProcessGroupHComm& pg, at::Tensor& out, at::Tensor& in, std::vector<int64_t> counts,
             const c10d::ReduceOp& op) { return pg.reduce_scatter_v(out, in, std::move(counts), op); },
          py::arg("output"), py::arg("input"), py::arg("counts"), py::arg("op"),
          py::call_guard<py::gil_scoped_release>())
      // A call the Python wrappers refused before it reached C++ (their own
      // argument checks): under HCOMM_DEBUG the other ranks learn it at once.
      .def(
          "reject",
          [](ProcessGroupHComm& pg, const std::string& op, const std::string& why) {
            CollectiveArgs a;
            for (int k = 0; k < static_cast<int>(OpKind::kCount); ++k)
              if (op == op_name(static_cast<OpKind>(k))) a.kind = static_cast<OpKind>(k);
            pg.communicator().reject(a, why);
          },
          py::arg("op"), py::arg("why"), py::call_guard<py::gil_scoped_release>())
      // Same name as on ProcessGroupGloo/NCCL (torch's _set_pg_timeout only
      // reaches those two, so hcomm.set_timeout calls this).
      .def("_set_default_timeout", [](ProcessGroupHComm& pg, std::chrono::milliseconds timeout) {
        pg.setTimeout(timeout);
      }, py::arg("timeout"), py::call_guard<py::gil_scoped_release>())
      .def("history", [](ProcessGroupHComm& pg) {
        py::list out;
        for (const auto& r : pg.communicator().history()) out.append(record_to_dict(r));
        return out;
      }, "Records of the most recent ops (oldest first): algorithm, chunk size, time, bytes per tier.")
      .def("clear_history", [](ProcessGroupHComm& pg) { pg.communicator().clear_history(); })
      .def("set_algorithm", [](ProcessGroupHComm& pg, const std::string& name) {
        if (!name.empty() && find_algorithm(name) == nullptr)
          throw Error(ErrorKind::kInvalidArgument, "hcomm: unknown algorithm '" + name + "'");
        pg.communicator().set_forced_algorithm(name);
      })
      .def("algorithm", [](ProcessGroupHComm& pg) { return pg.communicator().forced_algorithm(); })
      .def("set_link_model", [](ProcessGroupHComm& pg, double alpha, double beta) {
        LinkModel l;
        l.alpha = alpha;
        l.beta = beta;
        pg.communicator().set_link_model(l);
      })
      .def("plan", [](ProcessGroupHComm& pg, const std::string& op, int dtype, int64_t count, int reduce) {
        Selection s = pg.communicator().plan(plan_args(pg, op, dtype, count, reduce));
        return py::make_tuple(s.algorithm->name(), s.predicted_seconds, s.note);
      }, py::arg("op"), py::arg("dtype"), py::arg("count"), py::arg("reduce") = 0)
      .def("predict", [](ProcessGroupHComm& pg, const std::string& op, int dtype, int64_t count, int reduce,
                         const std::string& algorithm) {
        return pg.communicator().predict(plan_args(pg, op, dtype, count, reduce), algorithm);
      }, py::arg("op"), py::arg("dtype"), py::arg("count"), py::arg("reduce"), py::arg("algorithm"))
      .def(
          "set_hierarchy",
          [](ProcessGroupHComm& pg, std::vector<std::vector<int>> islands, c10::intrusive_ptr<c10d::Backend> island,
             double intra_alpha, double intra_beta, double inter_alpha, double inter_beta, std::vector<double> weights,
             bool proportional, std::vector<int> sharing, std::shared_ptr<Transport> intra_transport,
             std::vector<double> island_betas, int exchange) {
            LinkModel intra, inter;
            intra.alpha = intra_alpha, intra.beta = intra_beta;
            inter.alpha = inter_alpha, inter.beta = inter_beta;
            TORCH_CHECK_VALUE(exchange >= 0 && exchange <= 2, "hcomm: exchange must be 0 (auto), 1 (direct) or 2 (owner)");
            pg.set_hierarchy(std::move(islands), island, intra, inter, std::move(weights), proportional,
                             std::move(sharing), std::move(intra_transport), std::move(island_betas),
                             static_cast<Hierarchy::Exchange>(exchange));
          },
          py::arg("islands"), py::arg("island_backend"), py::arg("intra_alpha"), py::arg("intra_beta"),
          py::arg("inter_alpha"), py::arg("inter_beta"), py::arg("weights"), py::arg("proportional"),
          py::arg("uplink_sharing"), py::arg("intra_transport") = nullptr,
          py::arg("island_betas") = std::vector<double>{}, py::arg("exchange") = 0)
      .def(
          "set_compression",
          [](ProcessGroupHComm& pg, int wire, int64_t chunk, bool ef) {
            pg.set_compression(wire < 0 ? std::nullopt : std::optional<DType>(static_cast<DType>(wire)), chunk, ef);
          },
          py::arg("wire"), py::arg("chunk") = 1024, py::arg("error_feedback") = false,
          "Wire dtype code for the inter-island tier (-1: off), fp8 chunk, error feedback.")
      .def("set_staging", &ProcessGroupHComm::set_staging, py::arg("force"), py::arg("chunk_bytes"),
           py::arg("copy_alpha") = 10e-6, py::arg("copy_beta") = 10e9,
           "Host staging of the inter-island tier (force: CPU tensors too, HCOMM_FORCE_STAGING).")
      .def_readwrite("topology_json", &ProcessGroupHComm::topology_json)
      .def_property_readonly("library", [](ProcessGroupHComm& pg) { return pg.communicator().library(); })
      .def_property_readonly("host_backend", &ProcessGroupHComm::host_backend);
  // The device path of the uneven collectives, on any c10d backend, so that
  // tests can run it over gloo on CPU tensors (tests/torch/test_device_uneven.py).
  m.def("_padded_all_gather_v",
        [](c10::intrusive_ptr<c10d::Backend> backend, at::Tensor output, at::Tensor input, std::vector<int64_t> counts) {
          padded_all_gather_v(*backend, output, input, counts)->wait();
        });
  m.def("_padded_reduce_scatter_v", [](c10::intrusive_ptr<c10d::Backend> backend, at::Tensor output, at::Tensor input,
                                       std::vector<int64_t> counts, int op) {
    c10d::ReduceOp r(static_cast<c10d::ReduceOp::RedOpType>(op));
    padded_reduce_scatter_v(*backend, output, input, counts, r)->wait();
  });
  m.attr("has_cuda") =
#ifdef HCOMM_WITH_CUDA
      true;
#else
      false;
#endif
}

}  // namespace hcomm
