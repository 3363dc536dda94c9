// Wire compression for the weak (inter-island) tier.
//
// A WireFormat says what goes on the wire for a buffer of float elements:
//   kFloat32                      - uncompressed (a copy / cast to fp32),
//   kBFloat16 / kFloat16          - one 16-bit value per element, RNE,
//   kFloat8E4M3 / kFloat8E5M2     - one fp32 scale per `chunk` elements,
//                                   then one byte per element (quantize.h).
// Wire layout: [scales: num_chunks * 4 bytes, fp8 only][elements], so the
// scales stay 4-byte aligned when the wire buffer is.
//
// The hierarchical all-reduce encodes a shard before the inter-island send
// and decode_accumulate()s what it receives into its fp32/bf16/fp16
// accumulator, without a temporary full-size buffer.
//
// Error feedback (EF): with a Residual, encode() sends Q(x + r) and keeps
// r = (x + r) - D(Q(x + r)), the part this rank has not yet sent, so the
// error does not accumulate across steps (Seide et al. 2014, Karimireddy et
// al. 2019).  One residual per (group, buffer) is kept in a ResidualStore.
// Compression is off unless a group or HCOMM_COMPRESS asks for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/types.h"

namespace hcomm {
namespace compress {

struct WireFormat {
  DType wire = DType::kFloat32;
  int64_t chunk = 1024;  // fp8 only: elements per scale
};

// Whether `fmt` is a wire format encode/decode accept (throws otherwise when
// `throw_if_not`).
bool wire_supported(const WireFormat& fmt, bool throw_if_not = false);

// Bytes of the encoded form of n elements.
size_t encoded_bytes(int64_t n, const WireFormat& fmt);

// The error-feedback state of one buffer: fp32, same length as the buffer.
// Reset to zeros when the length changes (a bucket was rebuilt).
class Residual {
 public:
  float* data(int64_t n);  // zero-filled on first use or when n changes
  int64_t size() const { return static_cast<int64_t>(r_.size()); }
  void reset() { r_.clear(); }

 private:
  std::vector<float> r_;
};

// src: n elements of fp32/bf16/fp16 -> wire (encoded_bytes(n, fmt) bytes).
// ef == nullptr: plain compression; otherwise error feedback through *ef.
void encode(const void* src, DType src_dtype, int64_t n, const WireFormat& fmt, void* wire, Residual* ef);

// wire -> dst (n elements of fp32/bf16/fp16).
void decode(const void* wire, int64_t n, const WireFormat& fmt, void* dst, DType dst_dtype);

// acc = acc OP decode(wire), computed in fp32, acc of fp32/bf16/fp16.
void decode_accumulate(const void* wire, int64_t n, const WireFormat& fmt, void* acc, DType acc_dtype, ReduceOp op);

}  // namespace compress
}  // namespace hcomm
