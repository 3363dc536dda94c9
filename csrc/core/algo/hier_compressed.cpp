// The compressed cross-island exchange of the hierarchical all-reduce.
#include <algorithm>
#include <cstring>
#include <set>

#include "core/algo/hier.h"
#include "core/compress/codec.h"

namespace hcomm {

bool compressed_inter(const Hierarchy& h, const CollectiveArgs& args) {
  const DType d = args.input.dtype;
  return h.compress && (d == DType::kFloat32 || d == DType::kBFloat16 || d == DType::kFloat16) &&
         (args.reduce == ReduceOp::kSum || args.reduce == ReduceOp::kAvg) && h.wire.wire != d;
}

void inter_island_all_reduce_compressed(Transport& flat, const Hierarchy& h, const Buffer& buf,
                                        const std::vector<std::vector<Range>>& partitions, ReduceOp op,
                                        int64_t buffer_key, size_t* bytes_sent) {
  const int rank = flat.rank();
  const int me = h.island_of[rank];
  const Range mine = partitions[me][h.local_index[rank]];
  if (mine.size() == 0 || h.count() < 2) return;
  // Cut my range at every island's partition boundaries.
  std::set<int64_t> cuts{mine.begin, mine.end};
  for (const auto& parts : partitions)
    for (const Range& r : parts)
      for (int64_t b : {r.begin, r.end})
        if (b > mine.begin && b < mine.end) cuts.insert(b);
  std::vector<Range> pieces;
  for (auto it = cuts.begin(); std::next(it) != cuts.end(); ++it) pieces.push_back(Range{*it, *std::next(it)});
  auto owner_in = [&](size_t island, const Range& piece) {
    for (size_t q = 0; q < partitions[island].size(); ++q)
      if (overlap(partitions[island][q], piece).size() == piece.size()) return h.islands[island][q];
    return -1;
  };
  const size_t esize = dtype_size(buf.dtype);
  // wires[island][piece]: island's encoding of the piece (mine encoded here).
  std::vector<std::vector<std::vector<uint8_t>>> wires(h.count(), std::vector<std::vector<uint8_t>>(pieces.size()));
  std::vector<std::unique_ptr<Pending>> ops;
  for (size_t p = 0; p < pieces.size(); ++p) {
    const Range& piece = pieces[p];
    auto& own = wires[me][p];
    own.resize(compress::encoded_bytes(piece.size(), h.wire));
    compress::Residual* ef = nullptr;
    std::shared_ptr<compress::Residual> hold;
    if (h.error_feedback && h.residuals) {
      hold = h.residuals->get("hier", buffer_key + piece.begin);
      ef = hold.get();
    }
    compress::encode(buf.slice(piece.begin, 0).data, buf.dtype, piece.size(), h.wire, own.data(), ef);
    for (size_t j = 0; j < h.count(); ++j) {
      if (static_cast<int>(j) == me) continue;
      const int peer = owner_in(j, piece);
      wires[j][p].resize(own.size());
      Buffer out{own.data(), static_cast<int64_t>(own.size()), DType::kUInt8};
      Buffer in{wires[j][p].data(), static_cast<int64_t>(own.size()), DType::kUInt8};
      ops.push_back(flat.irecv(in, peer, kTagInter));
      ops.push_back(flat.isend(out, peer, kTagInter));
      if (bytes_sent) *bytes_sent += own.size();
    }
  }
  for (auto& o : ops) o->wait();
  (void)esize;
  for (size_t p = 0; p < pieces.size(); ++p) {
    void* acc = buf.slice(pieces[p].begin, 0).data;
    const int64_t n = pieces[p].size();
    compress::decode(wires[0][p].data(), n, h.wire, acc, buf.dtype);
    for (size_t j = 1; j < h.count(); ++j)
      compress::decode_accumulate(wires[j][p].data(), n, h.wire, acc, buf.dtype,
                                  op == ReduceOp::kAvg ? ReduceOp::kSum : op);
  }
}

}  // namespace hcomm
