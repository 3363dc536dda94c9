// Building blocks of the hierarchical algorithms: partitions of a buffer
// among an island's ranks, their overlaps across islands, and the
// cross-island exchange of overlapping pieces.
//
// Islands may differ in size (3+2+1).  Each island splits the buffer (or a
// region of it) among its own ranks; a piece of data is then owned by one
// rank per island, and the owners of the same element in different islands
// exchange it directly.  No island waits on a root-only path, and every byte
// crosses the slow tier once per destination island.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "core/algo/algorithm.h"

namespace hcomm {

struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end > begin ? end - begin : 0; }
};

// Splits [begin, end) among an island's ranks: equal shares, or shares
// proportional to each rank's inter-island weight when the hierarchy asks.
std::vector<Range> island_partition(const Hierarchy& h, int island, Range whole);

// Intersection of two ranges (empty when disjoint).
Range overlap(Range a, Range b);

// Tags keep concurrent pipeline stages apart on the same pair of ranks.
constexpr int kTagIntraRS = kAlgoTag + 1;
constexpr int kTagIntraAG = kAlgoTag + 2;
constexpr int kTagInter = kAlgoTag + 3;
constexpr int kTagInterReturn = kAlgoTag + 4;  // the owner exchange's second phase

// Cross-island all-reduce of this rank's range `mine` (a slice of `buf`):
// exchanges overlapping pieces with the owners in every other island (as
// given by `partitions[island][local]`) and reduces them in island order,
// so every owner of an element computes bitwise the same result.
void inter_island_all_reduce(Transport& flat, const Hierarchy& h, const Buffer& buf,
                             const std::vector<std::vector<Range>>& partitions, ReduceOp op,
                             std::vector<uint8_t>& scratch, size_t* bytes_sent);

// The cross-island step as a reduce-scatter + all-gather across islands
// (hier_owner.cpp): island j reduces its owner range `owners[j]`.  Better
// than the direct exchange from 3 islands up; bitwise the same results.
// Two phases on their own tags, so that chunk k's return phase (the uplink's
// ingress, mostly) overlaps chunk k+1's reduce phase (its egress):
// - reduce: partials of the others' owner ranges out, of mine in; reduce in
//   island order; `divide_by` > 1 divides the results (an average);
// - return: the results of what I own out, the rest of my partition in.
void owner_reduce_phase(Transport& flat, const Hierarchy& h, const Buffer& buf,
                        const std::vector<std::vector<Range>>& partitions, const std::vector<Range>& owners,
                        ReduceOp op, int divide_by, std::vector<uint8_t>& scratch, size_t* bytes_sent);
void owner_return_phase(Transport& flat, const Hierarchy& h, const Buffer& buf,
                        const std::vector<std::vector<Range>>& partitions, const std::vector<Range>& owners,
                        size_t* bytes_sent);
// Each island's share of the owner ranges for uplink bandwidths `beta`
// (bytes/s): the shares that minimise the slowest uplink's time, where an
// island with share f moves (1 + (k - 2) f) x bytes each way.
std::vector<double> owner_shares(const std::vector<double>& beta);
// Hierarchy::island_beta, or inter_link.beta for every island when unset.
std::vector<double> island_betas(const Hierarchy& h);
// `whole` cut into consecutive ranges of those shares.
std::vector<Range> owner_ranges(const std::vector<double>& shares, Range whole);

// Whether the cross-island step of `args` goes compressed (h.compress, a
// float dtype the codec takes, and a sum or average).
bool compressed_inter(const Hierarchy& h, const CollectiveArgs& args);

// The compressed form of inter_island_all_reduce.  Pieces are the
// intersections of all islands' partitions, so each piece has one owner per
// island and is encoded once; every owner reduces the same decoded values
// (its own included) in island order, so results stay identical on all
// ranks.  With error feedback the residual of each piece is kept in
// h.residuals under (group, buffer_key + piece offset).
void inter_island_all_reduce_compressed(Transport& flat, const Hierarchy& h, const Buffer& buf,
                                        const std::vector<std::vector<Range>>& partitions, ReduceOp op,
                                        int64_t buffer_key, size_t* bytes_sent);

}  // namespace hcomm

namespace hcomm {

// The checks every hierarchical algorithm's supports() starts with: `args`
// is one of `kinds`, the group spans more than one island, the buffers are on
// the host, and (when `contiguous`) islands are contiguous rank ranges.
bool hier_applies(const CollectiveArgs& args, const AlgoContext& ctx, std::initializer_list<OpKind> kinds,
                  bool contiguous, std::string* why);

// Whether every island is a contiguous run of global ranks (how torchrun and
// the emulator number them); the hierarchical gather/scatter family needs it
// so an island's blocks form one range of the buffer.
bool islands_contiguous(const Hierarchy& h);

// Runs `args` on `t` alone (no hierarchy): the library's native collective
// when it has one, else hcomm's flat algorithm.  For the intra-island phases.
void run_flat(Transport& t, const CollectiveArgs& args, AlgoContext& parent, OpRecord& record);

// Element range of island `i`'s blocks, given per-global-rank counts.
Range island_range(const Hierarchy& h, int island, const std::vector<int64_t>& offsets);

// The copy engine that stages `b` on this rank (Hierarchy::staging, when it
// serves b's kind of memory), or nullptr when b goes to the network direct.
stage::CopyEngine* staging_engine(const Hierarchy& h, const Buffer& b);

// Every range moved by `by` elements: the partitions as seen from a host copy
// whose element 0 is element -by of the caller's buffer.
std::vector<std::vector<Range>> shifted(std::vector<std::vector<Range>> parts, int64_t by);

}  // namespace hcomm
