// The CPU kernels, written once over a small vector interface `O` and
// instantiated by each ISA's translation unit (ops_portable.cpp,
// ops_avx2.cpp, ops_avx512.cpp).
//
// Include this inside an anonymous namespace, after the ISA's target pragma
// and after every header it needs: it includes nothing itself, so that no
// inline function with external linkage is ever compiled for a wider ISA
// than the baseline (the linker could otherwise keep that copy for callers
// in baseline code and crash a CPU that lacks the ISA).
//
// O provides: W (lanes), V (fp32 vector), load<F>/store<F> of W elements of
// format F at element i, set1, mul, add, min/max (NaN-propagating, and
// "b < a ? b : a" on ties so signed zeros match the scalar code), amax_step
// (running max of finite magnitudes) and hmax.
//
// Tails (n % W elements) use the scalar conversions from half.h/fp8.h, which
// produce the same bits as the vector code; tests check every ISA against
// the same reference.

template <Fmt F>
inline float sload(const void* p, int64_t i) {
  if constexpr (F == Fmt::kF32) return static_cast<const float*>(p)[i];
  else if constexpr (F == Fmt::kBF16) return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
  else if constexpr (F == Fmt::kF16) return fp16_to_float(static_cast<const uint16_t*>(p)[i]);
  else if constexpr (F == Fmt::kE4M3) return fp8::e4m3_to_float(static_cast<const uint8_t*>(p)[i]);
  else return fp8::e5m2_to_float(static_cast<const uint8_t*>(p)[i]);
}

template <Fmt F>
inline void sstore(void* p, int64_t i, float v) {
  if constexpr (F == Fmt::kF32) static_cast<float*>(p)[i] = v;
  else if constexpr (F == Fmt::kBF16) static_cast<uint16_t*>(p)[i] = float_to_bf16(v);
  else if constexpr (F == Fmt::kF16) static_cast<uint16_t*>(p)[i] = float_to_fp16(v);
  else if constexpr (F == Fmt::kE4M3) static_cast<uint8_t*>(p)[i] = fp8::float_to_e4m3(v);
  else static_cast<uint8_t*>(p)[i] = fp8::float_to_e5m2(v);
}

template <FOp OP>
inline float sapply(float a, float b) {
  if constexpr (OP == FOp::kSum) return a + b;
  else if constexpr (OP == FOp::kProd) return a * b;
  else if constexpr (OP == FOp::kMin) return (a != a || b != b) ? a + b : (b < a ? b : a);
  else return (a != a || b != b) ? a + b : (b > a ? b : a);
}

template <class O, FOp OP>
inline typename O::V vapply(typename O::V a, typename O::V b) {
  if constexpr (OP == FOp::kSum) return O::add(a, b);
  else if constexpr (OP == FOp::kProd) return O::mul(a, b);
  else if constexpr (OP == FOp::kMin) return O::min(a, b);
  else return O::max(a, b);
}

template <class O, Fmt S, Fmt D, bool kScaled, bool kNT>
int64_t convert_run(const void* src, void* dst, int64_t i, int64_t end, float mul) {
  const typename O::V m = O::set1(mul);
#pragma GCC unroll 2
  for (; i + O::W <= end; i += O::W) {
    typename O::V v = O::template load<S>(src, i);
    if constexpr (kScaled) v = O::mul(v, m);
    if constexpr (kNT) O::template stream<D>(dst, i, v);
    else O::template store<D>(dst, i, v);
  }
  return i;
}

// kNT: non-temporal stores where O has them (O::kStream), after a scalar
// head up to the first register-aligned element of dst.
template <class O, Fmt S, Fmt D, bool kNT>
void convert(const void* src, void* dst, int64_t n, float mul) {
  int64_t i = 0;
  const bool scaled = mul != 1.0f;
  auto scalar = [&](int64_t end) {
    for (; i < end; ++i) sstore<D>(dst, i, scaled ? sload<S>(src, i) * mul : sload<S>(src, i));
  };
  if constexpr (kNT && O::kStream) {
    constexpr int64_t kVecBytes = O::W * fmt_bytes<D>();
    const auto addr = reinterpret_cast<uintptr_t>(dst);
    if (addr % fmt_bytes<D>() == 0) {
      scalar(std::min<int64_t>(n, static_cast<int64_t>((kVecBytes - addr % kVecBytes) % kVecBytes) / fmt_bytes<D>()));
      i = scaled ? convert_run<O, S, D, true, true>(src, dst, i, n, mul)
                 : convert_run<O, S, D, false, true>(src, dst, i, n, mul);
      O::fence();
      scalar(n);
      return;
    }
  }
  i = scaled ? convert_run<O, S, D, true, false>(src, dst, i, n, mul)
             : convert_run<O, S, D, false, false>(src, dst, i, n, mul);
  scalar(n);
}

template <class O, Fmt A, Fmt S, FOp OP>
void accumulate(void* acc, const void* src, int64_t n, float mul) {
  const int64_t vec_end = n - n % O::W;
  int64_t i = 0;
  if (mul == 1.0f) {
#pragma GCC unroll 2
    for (; i < vec_end; i += O::W) {
      typename O::V r = vapply<O, OP>(O::template load<A>(acc, i), O::template load<S>(src, i));
      O::template store<A>(acc, i, r);
    }
    for (; i < n; ++i) sstore<A>(acc, i, sapply<OP>(sload<A>(acc, i), sload<S>(src, i)));
  } else {
    // The product is rounded before the op (no fused multiply-add: the TUs
    // are built with fp-contract off) so every ISA and the CUDA kernels,
    // which use __fmul_rn/__fadd_rn, agree to the bit.
    const typename O::V m = O::set1(mul);
#pragma GCC unroll 2
    for (; i < vec_end; i += O::W) {
      typename O::V s = O::mul(O::template load<S>(src, i), m);
      O::template store<A>(acc, i, vapply<O, OP>(O::template load<A>(acc, i), s));
    }
    for (; i < n; ++i) sstore<A>(acc, i, sapply<OP>(sload<A>(acc, i), sload<S>(src, i) * mul));
  }
}

template <class O, Fmt S>
float amax(const void* src, int64_t n) {
  const int64_t vec_end = n - n % O::W;
  typename O::V m = O::set1(0.0f);
  int64_t i = 0;
  for (; i < vec_end; i += O::W) m = O::amax_step(m, O::template load<S>(src, i));
  float r = O::hmax(m);
  for (; i < n; ++i) {
    float a = bits_to_float(float_to_bits(sload<S>(src, i)) & 0x7fffffffu);
    if (a <= 3.40282347e38f && a > r) r = a;  // finite only: NaN and inf compare false
  }
  return r;
}

template <class O, int... I>
void fill_convert(KernelTable& t, std::integer_sequence<int, I...>) {
  ((t.convert[I / kNumFmt][I % kNumFmt] =
        &convert<O, static_cast<Fmt>(I / kNumFmt), static_cast<Fmt>(I % kNumFmt), false>),
   ...);
  ((t.convert_stream[I / kNumFmt][I % kNumFmt] =
        &convert<O, static_cast<Fmt>(I / kNumFmt), static_cast<Fmt>(I % kNumFmt), O::kStream>),
   ...);
}

template <class O, int... I>
void fill_accumulate(KernelTable& t, std::integer_sequence<int, I...>) {
  constexpr int kPer = kNumFmt * kNumFOp;
  ((t.accumulate[I / kPer][(I % kPer) / kNumFOp][I % kNumFOp] =
        &accumulate<O, static_cast<Fmt>(I / kPer), static_cast<Fmt>((I % kPer) / kNumFOp),
                    static_cast<FOp>(I % kNumFOp)>),
   ...);
}

template <class O>
KernelTable make_table(const char* name) {
  KernelTable t{};
  t.name = name;
  fill_convert<O>(t, std::make_integer_sequence<int, kNumFmt * kNumFmt>{});
  fill_accumulate<O>(t, std::make_integer_sequence<int, kNumAccFmt * kNumFmt * kNumFOp>{});
  t.amax[0] = &amax<O, Fmt::kF32>;
  t.amax[1] = &amax<O, Fmt::kBF16>;
  t.amax[2] = &amax<O, Fmt::kF16>;
  return t;
}
