// ProcessGroupHComm: the gather/scatter family (all_gather, gather, scatter,
// reduce_scatter, all_to_all) and hcomm's uneven `_v` forms.
#include <c10/util/Exception.h>

#include "torch/device_uneven.h"
#include "torch/process_group.h"
#include "torch/tensor_util.h"

namespace hcomm {

namespace {
// Every tensor of a call, for the one-device check.
std::vector<at::Tensor> joined(const std::vector<std::vector<at::Tensor>>& lists, const std::vector<at::Tensor>& more) {
  std::vector<at::Tensor> all(more);
  for (const auto& l : lists) all.insert(all.end(), l.begin(), l.end());
  return all;
}
std::vector<at::Tensor> joined(const std::vector<at::Tensor>& a, const std::vector<std::vector<at::Tensor>>& lists) {
  return joined(lists, a);
}
std::vector<at::Tensor> joined(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  return joined(std::vector<std::vector<at::Tensor>>{b}, a);
}
}  // namespace
namespace {

std::vector<int64_t> numels(const std::vector<at::Tensor>& ts) {
  std::vector<int64_t> n;
  for (auto& t : ts) n.push_back(t.numel());
  return n;
}

bool all_equal(const std::vector<int64_t>& v) {
  for (int64_t x : v)
    if (x != v.front()) return false;
  return true;
}

// Copies slices of `flat` into `parts` (in order) on the worker.
std::function<void()> scatter_back(at::Tensor flat, std::vector<at::Tensor> parts) {
  return [flat, parts]() mutable {
    int64_t off = 0;
    for (auto& p : parts) {
      p.copy_(flat.narrow(0, off, p.numel()).view(p.sizes()));
      off += p.numel();
    }
  };
}

at::Tensor concat(const std::vector<at::Tensor>& parts) {
  std::vector<at::Tensor> flat;
  for (auto& p : parts) flat.push_back(p.reshape({-1}));
  return at::cat(flat);
}

// `out` if it can be written in place, else a contiguous stand-in whose
// contents are copied into `out` after the op.
at::Tensor writable(const at::Tensor& out) { return out.is_contiguous() ? out : at::empty_like(out, at::MemoryFormat::Contiguous); }

std::function<void()> copy_into(at::Tensor user, at::Tensor work) {
  if (work.is_same(user)) return nullptr;
  return [user, work]() mutable { user.copy_(work); };
}

// all_to_all_single splits count rows of dim 0 and the core counts elements.
// A hostile row count times the row length can wrap to a plausible element
// count (2^62 rows of 4 is 0), which the core could not tell from a real one,
// so with rows wider than one element the splits are checked here, in rows
// and in the core's order and words, before multiplying.  1-D splits are
// elements already: the core checks them.
std::vector<int64_t> rows_to_elements(std::vector<int64_t> splits, const at::Tensor& t, int64_t row,
                                      const char* name, const char* what, int rank, int size) {
  if (t.dim() <= 1) return splits;
  const int64_t rows = t.size(0);
  TORCH_CHECK_VALUE(static_cast<int>(splits.size()) == size, "hcomm: all_to_all_single on rank ", rank, ": ", name,
                    " has ", splits.size(), " entries but the group has ", size, " ranks");
  for (size_t i = 0; i < splits.size(); ++i)
    TORCH_CHECK_VALUE(splits[i] >= 0, "hcomm: all_to_all_single on rank ", rank, ": ", name, " has a negative entry ",
                      splits[i], " at index ", i);
  int64_t sum = 0;
  for (size_t i = 0; i < splits.size(); ++i) {
    TORCH_CHECK_VALUE(splits[i] <= rows, "hcomm: all_to_all_single on rank ", rank, ": ", name, "[", i, "] = ",
                      splits[i], " exceeds the ", what, "'s ", rows, " rows");
    sum += splits[i];  // <= size * rows: cannot overflow
  }
  TORCH_CHECK_VALUE(sum == rows, "hcomm: all_to_all_single on rank ", rank, ": ", name, " sums to ", sum,
                    " rows but the ", what, " has ", rows);
  for (auto& s : splits) s *= row;  // <= numel: cannot overflow
  return splits;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupHComm::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllgatherOptions& opts) {
  if (on_device("all_gather", joined(outputs, inputs))) return device_backend_->allgather(outputs, inputs, opts);
  CollectiveArgs a;
  a.kind = OpKind::kAllGather;
  std::vector<at::Tensor>* outs_p = nullptr;
  std::vector<int64_t> counts;
  at::Tensor in;
  try {
    check_single(inputs, "allgather");
    TORCH_CHECK_VALUE(outputs.size() == 1, "hcomm: allgather takes one output list, got ", outputs.size());
    outs_p = &outputs[0];
    TORCH_CHECK_VALUE(static_cast<int>(outs_p->size()) == getSize(), "hcomm: allgather on rank ", getRank(),
                      ": output list has ", outs_p->size(), " tensors but the group has ", getSize(), " ranks");
    in = inputs[0].contiguous();
    check_dense(in, "allgather", "input");
    for (auto& o : *outs_p) check_same_dtype(in, o, "allgather");
    counts = numels(*outs_p);
    if (all_equal(counts))
      TORCH_CHECK_VALUE(counts[0] == in.numel(), "hcomm: allgather on rank ", getRank(), ": output tensors have ",
                        counts[0], " elements but the input has ", in.numel());
  } catch (const c10::Error& e) {
    // Only this rank can see its list is wrong; under HCOMM_DEBUG the others
    // learn it now instead of waiting out the timeout for this rank.
    comm_->reject(a, e.msg());
    throw;
  }
  auto& outs = *outs_p;
  at::Tensor flat = at::empty({total_of(counts)}, in.options());
  a.input = to_buffer(in);
  a.output = to_buffer(flat);
  if (!all_equal(counts)) {  // outputs of different sizes: the uneven all_gather_v
    a.kind = OpKind::kAllGatherV;
    a.output_counts = counts;
  }
  std::vector<at::Tensor> keep{in, flat};
  return run(std::move(a), c10d::OpType::ALLGATHER, keep, scatter_back(flat, outs), outs, "hcomm:all_gather");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHComm::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::AllgatherOptions& opts) {
  if (on_device("all_gather", {output, input})) return device_backend_->_allgather_base(output, input, opts);
  checked(*comm_, OpKind::kAllGather, [&] {
    check_dense(input, "all_gather_into_tensor", "input");
    check_same_dtype(input, output, "all_gather_into_tensor");
    TORCH_CHECK_VALUE(output.numel() == input.numel() * getSize(), "hcomm: all_gather_into_tensor output has ",
                      output.numel(), " elements; expected world size ", getSize(), " x input ", input.numel(), " = ",
                      input.numel() * getSize());
  });
  at::Tensor in = input.contiguous(), out = writable(output);
  CollectiveArgs a;
  a.kind = OpKind::kAllGather;
  a.input = to_buffer(in);
  a.output = to_buffer(out);
  a.shape = shape_of(input);
  return run(std::move(a), c10d::OpType::_ALLGATHER_BASE, {in, out, output}, copy_into(output, out), {output},
             "hcomm:all_gather_into_tensor");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHComm::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                      std::vector<at::Tensor>& inputs,
                                                                      const c10d::AllgatherOptions& opts) {
  // torch's layout (and gloo's): one output list per rank, outputs[rank][i]
  // receiving rank's inputs[i]; each input is gathered on its own.
  std::vector<std::vector<at::Tensor>> per_input(inputs.size());
  checked(*comm_, OpKind::kAllGather, [&] {
    TORCH_CHECK_VALUE(static_cast<int>(outputs.size()) == getSize(), "hcomm: all_gather_coalesced on rank ",
                      getRank(), ": output_tensor_lists has ", outputs.size(), " lists but the group has ", getSize(),
                      " ranks (one list per rank, each as long as input_tensor_list)");
    for (size_t r = 0; r < outputs.size(); ++r) {
      TORCH_CHECK_VALUE(outputs[r].size() == inputs.size(), "hcomm: all_gather_coalesced on rank ", getRank(),
                        ": output_tensor_lists[", r, "] has ", outputs[r].size(), " tensors for ", inputs.size(),
                        " inputs");
      for (size_t i = 0; i < inputs.size(); ++i) per_input[i].push_back(outputs[r][i]);
    }
  });
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::vector<at::Tensor> all_outputs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<std::vector<at::Tensor>> o{per_input[i]};
    std::vector<at::Tensor> in{inputs[i]};
    works.push_back(allgather(o, in, opts));
    for (auto& t : per_input[i]) all_outputs.push_back(t);
  }
  return join(std::move(works), c10d::OpType::ALLGATHER_COALESCED, all_outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHComm::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                  std::vector<at::Tensor>& inputs,
                                                                                  const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "hcomm: allgather_into_tensor_coalesced has ", outputs.size(),
                    " outputs for ", inputs.size(), " inputs");
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (size_t i = 0; i < inputs.size(); ++i) works.push_back(_allgather_base(outputs[i], inputs[i], opts));
  return join(std::move(works), c10d::OpType::COALESCED, outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHComm::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::GatherOptions& opts) {
  if (on_device("gather", joined(outputs, inputs))) return device_backend_->gather(outputs, inputs, opts);
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor in;
  std::vector<at::Tensor> outs;
  checked(*comm_, OpKind::kGather, [&] {
    check_single(inputs, "gather");
    TORCH_CHECK_VALUE(root >= 0 && root < getSize(), "hcomm: gather root ", root, " is out of range for a group of ",
                      getSize());
    in = inputs[0].contiguous();
    check_dense(in, "gather", "input");
    if (getRank() == root) {
      TORCH_CHECK_VALUE(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                        "hcomm: gather root needs one list of ", getSize(), " output tensors");
      outs = outputs[0];
      for (auto& o : outs) {
        check_same_dtype(in, o, "gather");
        TORCH_CHECK_VALUE(o.numel() == in.numel(), "hcomm: gather output tensors need ", in.numel(),
                          " elements like the input, got ", o.numel());
      }
    } else {
      TORCH_CHECK_VALUE(outputs.empty() || outputs[0].empty(), "hcomm: gather outputs are only given on the root");
    }
  });
  CollectiveArgs a;
  a.kind = OpKind::kGather;
  a.root = root;
  a.input = to_buffer(in);
  at::Tensor flat = at::empty({getRank() == root ? in.numel() * getSize() : 0}, in.options());
  a.output = to_buffer(flat);
  return run(std::move(a), c10d::OpType::GATHER, {in, flat}, outs.empty() ? nullptr : scatter_back(flat, outs), outs,
             "hcomm:gather");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHComm::scatter(std::vector<at::Tensor>& outputs,
                                                          std::vector<std::vector<at::Tensor>>& inputs,
                                                          const c10d::ScatterOptions& opts) {
  if (on_device("scatter", joined(inputs, outputs))) return device_backend_->scatter(outputs, inputs, opts);
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor out;
  checked(*comm_, OpKind::kScatter, [&] {
    check_single(outputs, "scatter");
    TORCH_CHECK_VALUE(root >= 0 && root < getSize(), "hcomm: scatter root ", root, " is out of range for a group of ",
                      getSize());
    out = writable(outputs[0]);
    check_dense(out, "scatter", "output");
    if (getRank() == root) {
      TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                        "hcomm: scatter root needs one list of ", getSize(), " input tensors");
      for (auto& i : inputs[0]) {
        check_same_dtype(i, out, "scatter");
        TORCH_CHECK_VALUE(i.numel() == out.numel(), "hcomm: scatter input tensors need ", out.numel(),
                          " elements like the output, got ", i.numel());
      }
    }
  });
  at::Tensor flat = getRank() == root ? concat(inputs[0]) : at::empty({0}, out.options());
  CollectiveArgs a;
  a.kind = OpKind::kScatter;
  a.root = root;
  a.input = to_buffer(flat);
  a.output = to_buffer(out);
  return run(std::move(a), c10d::OpType::SCATTER, {flat, out, outputs[0]}, copy_into(outputs[0], out), outputs,
             "hcomm:scatter");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHComm::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                 std::vector<std::vector<at::Tensor>>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) {
  if (on_device("reduce_scatter", joined(inputs, outputs))) return device_backend_->reduce_scatter(outputs, inputs, opts);
  at::Tensor out;
  std::vector<int64_t> counts;
  checked(*comm_, OpKind::kReduceScatter, [&] {
    check_single(outputs, "reduce_scatter");
    TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                      "hcomm: reduce_scatter needs one list of ", getSize(), " input tensors");
    out = writable(outputs[0]);
    check_dense(out, "reduce_scatter", "output");
    for (auto& i : inputs[0]) check_same_dtype(i, out, "reduce_scatter");
    counts = numels(inputs[0]);
    TORCH_CHECK_VALUE(counts[getRank()] == out.numel(), "hcomm: reduce_scatter input ", getRank(), " has ",
                      counts[getRank()], " elements but the output has ", out.numel());
  });
  at::Tensor flat = concat(inputs[0]);
  CollectiveArgs a;
  a.kind = all_equal(counts) ? OpKind::kReduceScatter : OpKind::kReduceScatterV;
  if (a.kind == OpKind::kReduceScatterV) a.input_counts = counts;
  a.input = to_buffer(flat);
  a.output = to_buffer(out);
  a.reduce = to_hcomm_op(opts.reduceOp, out.scalar_type());
  return run(std::move(a), c10d::OpType::REDUCE_SCATTER, {flat, out, outputs[0]}, copy_into(outputs[0], out), outputs,
             "hcomm:reduce_scatter");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHComm::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                       const c10d::ReduceScatterOptions& opts) {
  if (on_device("reduce_scatter", {output, input})) return device_backend_->_reduce_scatter_base(output, input, opts);
  checked(*comm_, OpKind::kReduceScatter, [&] {
    check_dense(input, "reduce_scatter_tensor", "input");
    check_same_dtype(input, output, "reduce_scatter_tensor");
    TORCH_CHECK_VALUE(input.numel() == output.numel() * getSize(), "hcomm: reduce_scatter_tensor input has ",
                      input.numel(), " elements; expected world size ", getSize(), " x output ", output.numel(),
                      " = ", output.numel() * getSize());
  });
  at::Tensor in = input.contiguous(), out = writable(output);
  CollectiveArgs a;
  a.kind = OpKind::kReduceScatter;
  a.input = to_buffer(in);
  a.output = to_buffer(out);
  a.shape = shape_of(output);
  a.reduce = to_hcomm_op(opts.reduceOp, in.scalar_type());
  return run(std::move(a), c10d::OpType::_REDUCE_SCATTER_BASE, {in, out, output}, copy_into(output, out), {output},
             "hcomm:reduce_scatter_tensor");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHComm::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "hcomm: reduce_scatter_tensor_coalesced has ", outputs.size(),
                    " outputs for ", inputs.size(), " inputs");
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (size_t i = 0; i < inputs.size(); ++i) works.push_back(_reduce_scatter_base(outputs[i], inputs[i], opts));
  return join(std::move(works), c10d::OpType::COALESCED, outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHComm::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                std::vector<int64_t>& outputSplitSizes,
                                                                std::vector<int64_t>& inputSplitSizes,
                                                                const c10d::AllToAllOptions& opts) {
  if (on_device("all_to_all", {output, input})) return device_backend_->alltoall_base(output, input, outputSplitSizes, inputSplitSizes, opts);
  at::Tensor in, out;
  CollectiveArgs a;
  const bool even = outputSplitSizes.empty() && inputSplitSizes.empty();
  checked(*comm_, even ? OpKind::kAllToAll : OpKind::kAllToAllV, [&] {
    check_dense(input, "all_to_all_single", "input");
    check_same_dtype(input, output, "all_to_all_single");
    in = input.contiguous();
    out = writable(output);
    if (even) {
      a.kind = OpKind::kAllToAll;
      TORCH_CHECK_VALUE(in.dim() == 0 || in.size(0) % getSize() == 0,
                        "hcomm: all_to_all_single input's first dimension ", in.dim() ? in.size(0) : 0,
                        " does not split evenly over ", getSize(), " ranks");
    } else {
      // Splits count rows of dim 0; the core counts elements.
      a.kind = OpKind::kAllToAllV;
      const int64_t in_row = in.dim() && in.size(0) ? in.numel() / in.size(0) : 1;
      const int64_t out_row = out.dim() && out.size(0) ? out.numel() / out.size(0) : 1;
      std::vector<int64_t> send = inputSplitSizes, recv = outputSplitSizes;
      if (send.empty()) send.assign(getSize(), in.dim() ? in.size(0) / getSize() : 0);
      if (recv.empty()) recv.assign(getSize(), out.dim() ? out.size(0) / getSize() : 0);
      a.input_counts = rows_to_elements(send, in, in_row, "input_split_sizes", "input", getRank(), getSize());
      a.output_counts = rows_to_elements(recv, out, out_row, "output_split_sizes", "output", getRank(), getSize());
    }
  });
  a.input = to_buffer(in);
  a.output = to_buffer(out);
  return run(std::move(a), c10d::OpType::ALLTOALL_BASE, {in, out, output}, copy_into(output, out), {output},
             "hcomm:all_to_all_single");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHComm::alltoall(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllToAllOptions& opts) {
  if (on_device("all_to_all", joined(outputs, inputs))) return device_backend_->alltoall(outputs, inputs, opts);
  checked(*comm_, OpKind::kAllToAllV, [&] {
    TORCH_CHECK_VALUE(static_cast<int>(inputs.size()) == getSize() && static_cast<int>(outputs.size()) == getSize(),
                      "hcomm: all_to_all needs ", getSize(), " input and output tensors, got ", inputs.size(), " and ",
                      outputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      check_dense(inputs[i], "all_to_all", "input");
      check_same_dtype(inputs[i], outputs[i], "all_to_all");
      check_same_dtype(inputs[0], inputs[i], "all_to_all");
    }
  });
  at::Tensor in = concat(inputs);
  at::Tensor flat = at::empty({total_of(numels(outputs))}, in.options());
  CollectiveArgs a;
  a.kind = OpKind::kAllToAllV;
  a.input = to_buffer(in);
  a.output = to_buffer(flat);
  a.input_counts = numels(inputs);
  a.output_counts = numels(outputs);
  return run(std::move(a), c10d::OpType::ALLTOALL, {in, flat}, scatter_back(flat, outputs), outputs, "hcomm:all_to_all");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHComm::all_gather_v(at::Tensor& output, at::Tensor& input,
                                                               std::vector<int64_t> counts) {
  if (on_device("all_gather_v", {output, input})) return padded_all_gather_v(*device_backend_, output, input, counts);
  check_dense(input, "all_gather_v", "input");
  check_same_dtype(input, output, "all_gather_v");
  at::Tensor in = input.contiguous(), out = writable(output);
  CollectiveArgs a;
  a.kind = OpKind::kAllGatherV;
  a.input = to_buffer(in);
  a.output = to_buffer(out);
  a.output_counts = std::move(counts);
  return run(std::move(a), c10d::OpType::ALLGATHER, {in, out, output}, copy_into(output, out), {output},
             "hcomm:all_gather_v");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHComm::reduce_scatter_v(at::Tensor& output, at::Tensor& input,
                                                                   std::vector<int64_t> counts,
                                                                   const c10d::ReduceOp& op) {
  if (on_device("reduce_scatter_v", {output, input}))
    return padded_reduce_scatter_v(*device_backend_, output, input, counts, op);
  check_dense(input, "reduce_scatter_v", "input");
  check_same_dtype(input, output, "reduce_scatter_v");
  at::Tensor in = input.contiguous(), out = writable(output);
  CollectiveArgs a;
  a.kind = OpKind::kReduceScatterV;
  a.input = to_buffer(in);
  a.output = to_buffer(out);
  a.input_counts = std::move(counts);
  a.reduce = to_hcomm_op(op, in.scalar_type());
  return run(std::move(a), c10d::OpType::REDUCE_SCATTER, {in, out, output}, copy_into(output, out), {output},
             "hcomm:reduce_scatter_v");
}

}  // namespace hcomm
