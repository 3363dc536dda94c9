// Core bindings: enums, the algorithm table, error translation, and the
// thread-rank harness the algorithm tests use.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <thread>

#include "core/algo/algorithm.h"
#include "core/communicator.h"
#include "core/error.h"
#include "core/local_transport.h"
#include "core/stage/copy_engine.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace hcomm {

py::dict record_to_dict(const OpRecord& r) {
  py::dict d;
  d["seq"] = r.seq;
  d["op"] = op_name(r.kind);
  d["dtype"] = dtype_name(r.dtype);
  d["count"] = r.count;
  d["bytes"] = r.bytes;
  d["algorithm"] = r.algorithm;
  d["chunk_bytes"] = r.chunk_bytes;
  d["seconds"] = r.seconds;
  d["predicted_seconds"] = r.predicted_seconds;
  py::list tiers;
  for (const auto& t : r.tiers) {
    py::dict td;
    td["tier"] = t.tier;
    td["bytes"] = t.bytes;
    td["seconds"] = t.seconds;
    tiers.append(td);
  }
  d["tiers"] = tiers;
  d["staged_bytes"] = r.staged_bytes;
  d["ok"] = r.error.empty();
  d["error"] = r.error.empty() ? py::object(py::none()) : py::object(py::str(r.error));
  return d;
}

namespace {

Buffer as_buffer(py::handle obj, DType dtype) {
  if (obj.is_none()) return Buffer{nullptr, 0, dtype};
  py::buffer_info info = py::reinterpret_borrow<py::buffer>(obj).request(true);
  Buffer b;
  b.data = info.ptr;
  b.dtype = dtype;
  b.count = static_cast<int64_t>(info.size * info.itemsize / static_cast<py::ssize_t>(dtype_size(dtype)));
  return b;
}

// Runs one collective on `world` thread ranks; rank r uses inputs[r]/outputs[r].
py::list local_run(int world, int kind, int dtype, int reduce, int root, py::list inputs, py::list outputs,
                   std::vector<std::vector<int64_t>> input_counts, std::vector<std::vector<int64_t>> output_counts,
                   std::string algorithm, bool debug, int timeout_ms, int kill_rank,
                   std::vector<std::vector<int>> islands, std::vector<double> weights,
                   std::vector<int> reduce_per_rank, bool all_errors, std::vector<int> staged_ranks,
                   int64_t bridge_chunk, double stage_beta, std::vector<double> island_betas,
                   int exchange) {
  auto hub = std::make_shared<LocalHub>(world);
  // Optional islands: one more hub per island for its intra-island transport.
  std::vector<std::shared_ptr<LocalHub>> island_hubs;
  std::vector<int> island_of(world, -1), local_index(world, -1);
  for (size_t i = 0; i < islands.size(); ++i) {
    island_hubs.push_back(std::make_shared<LocalHub>(static_cast<int>(islands[i].size())));
    for (size_t j = 0; j < islands[i].size(); ++j) {
      int r = islands[i][j];
      if (r < 0 || r >= world || island_of[r] != -1)
        throw Error(ErrorKind::kInvalidArgument, "hcomm: islands must partition ranks 0.." + std::to_string(world - 1));
      island_of[r] = static_cast<int>(i);
      local_index[r] = static_cast<int>(j);
    }
  }
  if (!islands.empty())
    for (int r = 0; r < world; ++r)
      if (island_of[r] < 0) throw Error(ErrorKind::kInvalidArgument, "hcomm: rank " + std::to_string(r) + " is in no island");
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<CollectiveArgs> args(world);
  for (int r = 0; r < world; ++r) {
    CommConfig cfg;
    cfg.forced_algorithm = algorithm;
    cfg.debug_checks = debug;
    comms.push_back(std::make_unique<Communicator>(
        std::make_shared<LocalTransport>(hub, r, std::chrono::milliseconds(timeout_ms)), cfg));
    if (!islands.empty()) {
      auto h = std::make_shared<Hierarchy>();
      h->islands = islands;
      h->island_of = island_of;
      h->local_index = local_index;
      h->intra = std::make_shared<LocalTransport>(island_hubs[island_of[r]], local_index[r],
                                                  std::chrono::milliseconds(timeout_ms));
      h->inter_link.alpha = 1e-3;  // make the slow tier slow, so the model picks hier
      h->inter_link.beta = 1e8;
      h->intra_link.alpha = 1e-6;
      h->intra_link.beta = 1e10;
      h->inter_weight = weights;
      h->proportional = !weights.empty();
      // Staged ranks stand for a device island: their buffers cross the
      // islands only through the emulated copy engine (HCOMM_FORCE_STAGING).
      for (int s : staged_ranks)
        if (s == r) h->staging = stage::emulated_engine();
      h->bridge_chunk_bytes = static_cast<size_t>(bridge_chunk);
      if (stage_beta > 0) h->stage_link.beta = stage_beta;
      h->island_beta = island_betas;
      h->exchange = static_cast<Hierarchy::Exchange>(exchange);
      comms.back()->set_link_model(h->inter_link);
      comms.back()->set_hierarchy(h);
    }
    CollectiveArgs& a = args[r];
    a.kind = static_cast<OpKind>(kind);
    a.input = as_buffer(inputs[r], static_cast<DType>(dtype));
    a.output = as_buffer(outputs[r], static_cast<DType>(dtype));
    if (a.kind == OpKind::kAllReduce || a.kind == OpKind::kBroadcast || a.kind == OpKind::kReduce) a.output = a.input;
    a.reduce = static_cast<ReduceOp>(reduce_per_rank.empty() ? reduce : reduce_per_rank.at(r));
    a.root = root;
    if (!input_counts.empty()) a.input_counts = input_counts[r];
    if (!output_counts.empty()) a.output_counts = output_counts[r];
  }
  py::list records;
  std::vector<std::shared_ptr<Request>> reqs(world);
  std::string first_error;
  std::vector<std::string> errors(world);
  {
    py::gil_scoped_release nogil;
    for (int r = 0; r < world; ++r) {
      if (r == kill_rank) continue;  // this rank "dies": never joins
      try {
        reqs[r] = comms[r]->submit(args[r]);
      } catch (const std::exception& e) {
        if (first_error.empty()) first_error = e.what();
        errors[r] = e.what();
        // Under HCOMM_DEBUG a rejected call still joins the check, which is
        // what tells the others; without it, fail them as a dead peer would.
        if (!debug) hub->kill("hcomm: a peer failed before the collective: " + std::string(e.what()));
      }
    }
    for (int r = 0; r < world; ++r) {
      if (!reqs[r]) continue;
      try {
        reqs[r]->wait(std::chrono::milliseconds(-1));
      } catch (const std::exception& e) {
        if (first_error.empty()) first_error = e.what();
        errors[r] = e.what();
      }
    }
    comms.clear();
  }
  if (all_errors) {  // each rank's error (None: it succeeded), for tests that read every rank's
    py::list out;
    for (const auto& e : errors) out.append(e.empty() ? py::object(py::none()) : py::object(py::str(e)));
    return out;
  }
  if (!first_error.empty()) {
    bool invalid = first_error.find("hcomm: ") == 0 && first_error.find(" on rank ") != std::string::npos &&
                   first_error.find("timed out") == std::string::npos;
    throw Error(invalid ? ErrorKind::kInvalidArgument : ErrorKind::kRuntime, first_error);
  }
  for (int r = 0; r < world; ++r) records.append(reqs[r] ? record_to_dict(reqs[r]->record()) : py::dict());
  return records;
}

// Runs a sequence of collectives per thread rank on persistent communicators
// (test harness for what one call leaves behind for the next, e.g. a rank
// that fell behind): ops[r] = [(kind, count, root, delay_ms)], all_reduce,
// broadcast or barrier on float32 zeros.  Returns each rank's list of errors
// (None: that op succeeded).
py::list local_sequence(int world, std::vector<std::vector<std::tuple<int, int64_t, int, int>>> ops, bool debug,
                        int timeout_ms) {
  auto hub = std::make_shared<LocalHub>(world);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < world; ++r) {
    CommConfig cfg;
    cfg.debug_checks = debug;
    comms.push_back(std::make_unique<Communicator>(
        std::make_shared<LocalTransport>(hub, r, std::chrono::milliseconds(timeout_ms)), cfg));
  }
  std::vector<std::vector<std::string>> errors(world);
  {
    py::gil_scoped_release nogil;
    std::vector<std::thread> threads;
    for (int r = 0; r < world && r < static_cast<int>(ops.size()); ++r)
      threads.emplace_back([&, r] {
        for (const auto& [kind, count, root, delay_ms] : ops[r]) {
          std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
          std::vector<float> buf(static_cast<size_t>(count));
          CollectiveArgs a;
          a.kind = static_cast<OpKind>(kind);
          if (a.kind != OpKind::kBarrier) a.input = a.output = Buffer{buf.data(), count, DType::kFloat32};
          a.root = root;
          try {
            comms[r]->submit(a)->wait(std::chrono::milliseconds(-1));
            errors[r].emplace_back();
          } catch (const std::exception& e) {
            errors[r].emplace_back(e.what());
          }
        }
      });
    for (auto& t : threads) t.join();
    comms.clear();
  }
  py::list out;
  for (const auto& per_rank : errors) {
    py::list l;
    for (const auto& e : per_rank) l.append(e.empty() ? py::object(py::none()) : py::object(py::str(e)));
    out.append(l);
  }
  return out;
}

}  // namespace

void bind_core(py::module_& m) {
  py::object errors = py::module_::import("hcomm.errors");
  static py::object hcomm_error = errors.attr("HCommError");
  static py::object value_error = errors.attr("HCommValueError");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      PyErr_SetString((e.kind() == ErrorKind::kInvalidArgument ? value_error : hcomm_error).ptr(), e.what());
    }
  });

  py::dict dtypes, ops, kinds;
  for (int i = 0; i < static_cast<int>(DType::kCount); ++i) dtypes[dtype_name(static_cast<DType>(i))] = i;
  for (int i = 0; i < static_cast<int>(ReduceOp::kCount); ++i) ops[reduce_op_name(static_cast<ReduceOp>(i))] = i;
  for (int i = 0; i < static_cast<int>(OpKind::kCount); ++i) kinds[op_name(static_cast<OpKind>(i))] = i;
  m.attr("DTYPES") = dtypes;
  m.attr("REDUCE_OPS") = ops;
  m.attr("OP_KINDS") = kinds;

  m.def("algorithms", [] {
    py::list out;
    for (const Algorithm* a : algorithm_table()) out.append(py::make_tuple(a->name(), a->description()));
    return out;
  }, "The algorithm table: (name, description) in preference order.");

  m.def("reduce_supported", [](int dtype, int op) {
    std::string why;
    bool ok = reduce_supported(static_cast<DType>(dtype), static_cast<ReduceOp>(op), &why);
    return py::make_tuple(ok, why);
  });

  m.def("local_run", &local_run, py::arg("world"), py::arg("kind"), py::arg("dtype"), py::arg("reduce"),
        py::arg("root"), py::arg("inputs"), py::arg("outputs"), py::arg("input_counts"), py::arg("output_counts"),
        py::arg("algorithm") = "", py::arg("debug") = false, py::arg("timeout_ms") = 10000, py::arg("kill_rank") = -1,
        py::arg("islands") = std::vector<std::vector<int>>{}, py::arg("weights") = std::vector<double>{},
        py::arg("reduce_per_rank") = std::vector<int>{}, py::arg("all_errors") = false,
        py::arg("staged_ranks") = std::vector<int>{}, py::arg("bridge_chunk") = 0, py::arg("stage_beta") = 0.0,
        py::arg("island_betas") = std::vector<double>{}, py::arg("exchange") = 0,
        "Run one collective on `world` in-process thread ranks (test harness).");
  m.def("local_sequence", &local_sequence, py::arg("world"), py::arg("ops"), py::arg("debug") = false,
        py::arg("timeout_ms") = 10000, "Run a sequence of collectives per thread rank (test harness).");
}

}  // namespace hcomm
