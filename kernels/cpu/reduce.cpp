// kernels/cpu: reduction loops over [outer, reduced, inner, inner_reduced] layouts. Float sums run in many independent
// lanes (which the compiler vectorises: it may not reorder a single running sum) over blocks of 64 elements per lane;
// each block's lanes are added pairwise and the block result goes into a double total. The rounding error of an f32 sum
// is then that of ~70 additions, whatever the length. Column sums (inner > 1) fold every 64 rows into double totals the
// same way. Which path a reduction takes and how many partial results it combines depend on the shape alone
// (reduction_chunks), so the result has the same bits on any number of threads.
#include "kernels/cpu/reduce.h"

#include <limits>
#include <memory>
#include <type_traits>

#include "core/copy.h"
#include "core/dispatch.h"
#include "kernels/cpu/elementwise.h"

namespace weft::kernels::cpu {
namespace {

// Per-thread partial results (std::vector<bool> has no per-element storage to write into).
template <class T> struct Buffer {
  std::unique_ptr<T[]> p;
  Buffer(int64_t n, T init) : p(new T[size_t(n)]) { std::fill(p.get(), p.get() + n, init); }
  T& operator[](int64_t i) { return p[size_t(i)]; }
  T* data() { return p.get(); }
};

// A reducer says what a lane accumulates in (Lane), what lane results fold into (Total), and how. Lanes combine with
// step(), totals with merge(). Sums and products (Prod) of integers wrap.
template <class T, bool Prod = false> struct SumR {
  using Lane = std::conditional_t<is_float_v<T>, acc_t<T>, int64_t>;
  using Total = std::conditional_t<is_float_v<T>, double, int64_t>;
  static Lane in(T x) { return Lane(x); }
  static Lane init() { return Lane(Prod ? 1 : 0); }
  static Total total_init() { return Total(Prod ? 1 : 0); }
  template <class V> static V combine(V a, V b) {
    if constexpr (std::is_integral_v<V>) return int64_t(Prod ? uint64_t(a) * uint64_t(b) : uint64_t(a) + uint64_t(b));
    else return Prod ? a * b : a + b;
  }
  static Lane step(Lane a, Lane x) { return combine(a, x); }
  static Total fold(Total t, Lane l) { return merge(t, Total(l)); }
  static Total merge(Total a, Total b) { return combine(a, b); }
};
template <class T> using ProdR = SumR<T, true>;

// x^2 summed in f64: SumR<double> over the squares, each square of an f32 (or 16-bit) value
// exact in f64, so the bits of summing x.to(f64) squared.
template <class T> struct SumSqR : SumR<double> {
  static Lane in(T x) { return double(x) * double(x); }
};

// max/min: NaN wins (as torch.max), and it is exact, so Lane == Total.
template <class T, bool Max> struct ExtR {
  using Lane = acc_t<T>;
  using Total = Lane;
  static Lane in(T x) { return Lane(x); }
  static Lane init() {
    if constexpr (std::is_floating_point_v<Lane>)
      return Max ? -std::numeric_limits<Lane>::infinity() : std::numeric_limits<Lane>::infinity();
    else return Max ? std::numeric_limits<Lane>::lowest() : std::numeric_limits<Lane>::max();
  }
  static Total total_init() { return init(); }
  static Lane step(Lane a, Lane x) {
    if constexpr (Max) return (a > x || a != a) ? a : x;
    else return (a < x || a != a) ? a : x;
  }
  static Total fold(Total t, Lane l) { return step(t, l); }
  static Total merge(Total a, Total b) { return step(a, b); }
};

constexpr int64_t kRowBlock = 64;   // rows (or elements per lane) accumulated before folding
constexpr int64_t kMaxTile = 512;   // output columns one task accumulates

// L independent lanes over blocks of L * kRowBlock elements; lanes fold pairwise per block.
template <class R, int L, class T>
typename R::Total reduce_lanes(const T* p, int64_t n) {
  using Lane = typename R::Lane;
  typename R::Total total = R::total_init();
  for (int64_t b0 = 0; b0 < n; b0 += L * kRowBlock) {
    int64_t b1 = std::min(n, b0 + L * kRowBlock), i = b0;
    Lane acc[L];
    for (int j = 0; j < L; ++j) acc[j] = R::init();
    for (; i + L <= b1; i += L)
      for (int j = 0; j < L; ++j) acc[j] = R::step(acc[j], R::in(p[i + j]));
    for (; i < b1; ++i) acc[0] = R::step(acc[0], R::in(p[i]));
    for (int w = L / 2; w > 0; w /= 2)
      for (int j = 0; j < w; ++j) acc[j] = R::step(acc[j], acc[j + w]);
    total = R::fold(total, acc[0]);
  }
  return total;
}

// Reduction of n contiguous elements. Long runs use enough lanes to hide the add latency
// (several vector accumulators); short rows fewer, so the final fold stays cheap.
template <class R, class T>
typename R::Total reduce_contig(const T* p, int64_t n) {
  using Lane = typename R::Lane;
  if (n >= 1024) return reduce_lanes<R, std::max<int>(16, std::min<int>(64, 256 / sizeof(Lane)))>(p, n);
  if (n >= 32) return reduce_lanes<R, 16>(p, n);
  Lane acc = R::init();
  for (int64_t i = 0; i < n; ++i) acc = R::step(acc, R::in(p[i]));
  return R::fold(R::total_init(), acc);
}

// tot[j] <- merge(tot[j], reduction of column j over `rows` rows); x points at the first
// row's first column, rows are row_stride apart, w <= kMaxTile columns.
template <class R, class T>
void reduce_cols(const T* x, int64_t rows, int64_t row_stride, int64_t w, typename R::Total* tot) {
  using Lane = typename R::Lane;
  Lane acc[kMaxTile];
  for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
    int64_t r1 = std::min(rows, r0 + kRowBlock);
    for (int64_t j = 0; j < w; ++j) acc[j] = R::init();
    for (int64_t r = r0; r < r1; ++r) {
      const T* row = x + r * row_stride;
      for (int64_t j = 0; j < w; ++j) acc[j] = R::step(acc[j], R::in(row[j]));
    }
    for (int64_t j = 0; j < w; ++j) tot[j] = R::fold(tot[j], acc[j]);
  }
}

// Few outputs over long ranges [0, len): each output's range splits into kr pieces (multiples of align items), all
// outputs' pieces in one parallel loop, and an output's partial results piece(o, begin, end) merge in order.
template <class R, class O, class Piece, class Fin>
void split_outputs(O* out, int64_t n_out, int64_t len, int64_t kr, int64_t align, const Piece& piece, const Fin& fin) {
  using Total = typename R::Total;
  int64_t step = ((len + kr - 1) / kr + align - 1) / align * align;
  Buffer<Total> part(n_out * kr, R::total_init());
  parallel_chunks(n_out * kr, n_out * kr, 1, [&](int64_t p, int64_t, int64_t) {
    int64_t b = std::min(len, p % kr * step), e = std::min(len, b + step);
    if (b < e) part[p] = piece(p / kr, b, e);
  });
  for (int64_t o = 0; o < n_out; ++o) {
    Total t = part[o * kr];
    for (int64_t c = 1; c < kr; ++c) t = R::merge(t, part[o * kr + c]);
    out[o] = fin(t);
  }
}

// out[a * B + b] = reduction over r, s of x[((a * Rn + r) * B + b) * S + s]: contiguous runs of
// S elements, Rn of them (B * S apart) per output.
template <class R, class T, class O, class Fin>
void reduce_runs(const T* x, O* out, int64_t A, int64_t Rn, int64_t B, int64_t S, const Fin& fin) {
  using Total = typename R::Total;
  int64_t n_out = A * B, k = reduction_chunks(n_out * Rn * S, kParallelGrain);
  auto output = [&](int64_t o, int64_t r0, int64_t r1) {
    const T* base = x + ((o / B) * Rn * B + o % B) * S;
    Total t = R::total_init();
    for (int64_t r = r0; r < r1; ++r) t = R::merge(t, reduce_contig<R>(base + r * B * S, S));
    return t;
  };
  if (n_out >= k) {
    parallel_chunks(n_out, k, 1, [&](int64_t, int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) out[o] = fin(output(o, 0, Rn));
    });
    return;
  }
  // Few outputs: threads split each output's runs.
  split_outputs<R>(out, n_out, Rn, reduction_chunks(Rn * S, kParallelGrain), 1, output, fin);
}

template <class R, class T, class O, class Fin>
void reduce_typed(const T* x, O* out, int64_t A, int64_t Rn, int64_t B, int64_t S, const Fin& fin) {
  using Total = typename R::Total;
  if (S > 1 && B > 1) return reduce_runs<R>(x, out, A, Rn, B, S, fin);
  if (S > 1) Rn *= S;  // [A, Rn, 1, S] is [A, Rn * S, 1]
  int64_t k = reduction_chunks(A * Rn * B, kParallelGrain);
  if (B == 1) {
    if (A >= k) {  // enough rows to go to threads whole
      parallel_chunks(A, k, 1, [&](int64_t, int64_t b, int64_t e) {
        for (int64_t a = b; a < e; ++a) out[a] = fin(reduce_contig<R>(x + a * Rn, Rn));
      });
      return;
    }
    // Few long rows: threads split each row.
    auto piece = [&](int64_t a, int64_t b, int64_t e) { return reduce_contig<R>(x + a * Rn + b, e - b); };
    return split_outputs<R>(out, A, Rn, reduction_chunks(Rn, kParallelGrain), 64, piece, fin);
  }
  // Column tiles small enough for `chunks` tasks when outer is small. Whether a column is one
  // task's follows k; tile widths change no sum, so they follow the threads (narrow is slow).
  auto tiling = [&](int64_t chunks) {
    int64_t per_a = (chunks + A - 1) / A;
    return std::min(kMaxTile, std::max<int64_t>(16, ((B + per_a - 1) / per_a + 15) / 16 * 16));
  };
  const bool whole_columns = A * ((B + tiling(k) - 1) / tiling(k)) >= k;
  int64_t kt = num_chunks(A * Rn * B, kParallelGrain), tile = tiling(kt);
  int64_t tiles = (B + tile - 1) / tile, tasks = A * tiles;
  // Task t reduces rows [r0, r1) of one column tile into tot (the totals for that tile).
  auto run_task = [&](int64_t t, int64_t r0, int64_t r1, Total* tot) {
    int64_t a = t / tiles, b0 = (t % tiles) * tile, w = std::min(tile, B - b0);
    reduce_cols<R>(x + (a * Rn + r0) * B + b0, r1 - r0, B, w, tot);
  };
  auto tile_pos = [&](int64_t t) { return (t / tiles) * B + (t % tiles) * tile; };
  if (whole_columns) {
    parallel_chunks(tasks, std::min(tasks, kt), 1, [&](int64_t, int64_t b, int64_t e) {
      Total tot[kMaxTile];
      for (int64_t t = b; t < e; ++t) {
        int64_t w = std::min(tile, B - (t % tiles) * tile);
        for (int64_t j = 0; j < w; ++j) tot[j] = R::total_init();
        run_task(t, 0, Rn, tot);
        O* o = out + tile_pos(t);
        for (int64_t j = 0; j < w; ++j) o[j] = fin(tot[j]);
      }
    });
    return;
  }
  // Few output columns but many rows: threads take slices of the rows.
  int64_t n_out = A * B, kr = reduction_chunks(Rn, std::max<int64_t>(1, kParallelGrain / n_out));
  Buffer<Total> part(kr * n_out, R::total_init());
  parallel_chunks(Rn, kr, 1, [&](int64_t c, int64_t r0, int64_t r1) {
    for (int64_t t = 0; t < tasks; ++t) run_task(t, r0, r1, part.data() + c * n_out + tile_pos(t));
  });
  for (int64_t i = 0; i < n_out; ++i) {
    Total t = part[i];
    for (int64_t c = 1; c < kr; ++c) t = R::merge(t, part[c * n_out + i]);
    out[i] = fin(t);
  }
}

// ---- arg max/min

// Whether v beats the current best: strictly better (so the first of equal values stays),
// or a NaN against a non-NaN (NaN wins, as torch.max).
template <bool Max, class A> bool better(A v, A cur) {
  // Bitwise, not short-circuit, operators keep the loops branch-free (and vectorised).
  if constexpr (Max) return (v > cur) | ((v != v) & (cur == cur));
  else return (v < cur) | ((v != v) & (cur == cur));
}
// Whether candidate (v, i) should replace (bv, bi) when either may come first.
template <bool Max, class A> bool better_at(A v, int64_t i, A bv, int64_t bi) {
  return better<Max>(v, bv) || (!better<Max>(bv, v) && i < bi);
}

// Two passes, both vectorised: the extreme value, then the first block holding it. The
// second pass reads what the first just brought into cache.
template <bool Max, class T>
void arg_contig(const T* p, int64_t n, acc_t<T>& bv, int64_t& bi) {
  using A = acc_t<T>;
  A best = reduce_contig<ExtR<T, Max>>(p, n);
  bv = best;
  bool nan = best != best;
  constexpr int64_t kBlock = 64;
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    int64_t b1 = std::min(n, b0 + kBlock);
    int hit = 0;
    if (nan) {
      for (int64_t i = b0; i < b1; ++i) hit |= A(p[i]) != A(p[i]);
    } else {
      for (int64_t i = b0; i < b1; ++i) hit |= A(p[i]) == best;
    }
    if (!hit) continue;
    for (int64_t i = b0; i < b1; ++i) {
      A v = A(p[i]);
      if (nan ? v != v : v == best) {
        bi = i;
        return;
      }
    }
  }
  bi = 0;  // not reached: best is one of the elements
}

template <bool Max, class T>
void arg_typed(const T* x, T* vals, int64_t* idx, int64_t A, int64_t Rn, int64_t B) {
  using Acc = acc_t<T>;
  // Partial results combine exactly (first index wins ties): the split may follow the threads.
  int64_t k = num_chunks(A * Rn * B, kParallelGrain);
  if (B == 1) {
    if (A >= k) {
      parallel_chunks(A, k, 1, [&](int64_t, int64_t b, int64_t e) {
        for (int64_t a = b; a < e; ++a) {
          Acc bv;
          arg_contig<Max>(x + a * Rn, Rn, bv, idx[a]);
          vals[a] = convert_scalar<T>(bv);
        }
      });
      return;
    }
    for (int64_t a = 0; a < A; ++a) {
      int64_t kr = num_chunks(Rn, kParallelGrain);
      Buffer<Acc> pv(kr, Acc(0));
      Buffer<int64_t> pi(kr, 0);
      parallel_chunks(Rn, kr, 64, [&](int64_t c, int64_t b, int64_t e) {
        arg_contig<Max>(x + a * Rn + b, e - b, pv[c], pi[c]);
        pi[c] += b;
      });
      Acc bv = pv[0];
      int64_t bi = pi[0];
      for (int64_t c = 1; c < kr; ++c)
        if (better_at<Max>(pv[c], pi[c], bv, bi)) bv = pv[c], bi = pi[c];
      vals[a] = convert_scalar<T>(bv);
      idx[a] = bi;
    }
    return;
  }
  // Rows of B columns: keep a running best per column (vectorises along the columns).
  int64_t tiles = (B + kMaxTile - 1) / kMaxTile;
  parallel_chunks(A * tiles, std::min(k, A * tiles), 1, [&](int64_t, int64_t b, int64_t e) {
    Acc bv[kMaxTile];
    int64_t bi[kMaxTile];
    for (int64_t t = b; t < e; ++t) {
      int64_t a = t / tiles, b0 = (t % tiles) * kMaxTile, w = std::min(kMaxTile, B - b0);
      const T* base = x + a * Rn * B + b0;
      for (int64_t j = 0; j < w; ++j) bv[j] = Acc(base[j]), bi[j] = 0;
      for (int64_t r = 1; r < Rn; ++r) {
        const T* row = base + r * B;
        for (int64_t j = 0; j < w; ++j) {
          Acc v = Acc(row[j]);
          bool take = better<Max>(v, bv[j]);
          bv[j] = take ? v : bv[j];
          bi[j] = take ? r : bi[j];
        }
      }
      for (int64_t j = 0; j < w; ++j) {
        vals[a * B + b0 + j] = convert_scalar<T>(bv[j]);
        idx[a * B + b0 + j] = bi[j];
      }
    }
  });
}

}  // namespace

void reduce(ReduceOp op, const Tensor& out, const Tensor& x, int64_t outer, int64_t reduced, int64_t inner,
            int64_t inner_reduced) {
  WEFT_DISPATCH(x.dtype(), "reduce", [&]<typename T>() {
    const T* px = ptr<const T>(x);
    auto run = [&]<class R, class O>(auto fin) {
      reduce_typed<R>(px, ptr<O>(out), outer, reduced, inner, inner_reduced, fin);
    };
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::mean: {
        double scale = op == ReduceOp::mean ? 1.0 / (double(reduced) * double(inner_reduced)) : 1.0;
        using Total = typename SumR<T>::Total;
        if constexpr (is_float_v<T>) {
          if (op == ReduceOp::mean) run.template operator()<SumR<T>, T>([scale](Total t) { return convert_scalar<T>(t * scale); });
          else run.template operator()<SumR<T>, T>([](Total t) { return convert_scalar<T>(t); });
        } else {  // the sum; the front end refuses the mean of integers
          run.template operator()<SumR<T>, int64_t>([](Total t) { return t; });
        }
        return;
      }
      case ReduceOp::prod: {
        using Total = typename ProdR<T>::Total;
        using O = std::conditional_t<is_float_v<T>, T, int64_t>;
        run.template operator()<ProdR<T>, O>([](Total t) { return convert_scalar<O>(t); });
        return;
      }
      case ReduceOp::sum_squares:
        if constexpr (is_float_v<T>) run.template operator()<SumSqR<T>, double>([](double t) { return t; });
        return;
      case ReduceOp::max:
        run.template operator()<ExtR<T, true>, T>([](acc_t<T> t) { return convert_scalar<T>(t); });
        return;
      case ReduceOp::min:
        run.template operator()<ExtR<T, false>, T>([](acc_t<T> t) { return convert_scalar<T>(t); });
        return;
    }
  });
}

void arg_reduce(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& x, int64_t outer,
                int64_t reduced, int64_t inner) {
  WEFT_DISPATCH(x.dtype(), is_max ? "max_dim" : "min_dim", [&]<typename T>() {
    if (is_max) arg_typed<true>(ptr<const T>(x), ptr<T>(values), ptr<int64_t>(indices), outer, reduced, inner);
    else arg_typed<false>(ptr<const T>(x), ptr<T>(values), ptr<int64_t>(indices), outer, reduced, inner);
  });
}

}  // namespace weft::kernels::cpu
