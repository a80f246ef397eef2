// Block-sparse products on CPU, called from JAX through XLA's FFI
// (bert_flax/kernels/block_sparse_cpu.py builds this file and registers its two handlers).
//
//   grouped product  out[:, g] = sum_{t in group g} a[:, src[t]] @ w[blk[t]]     (all blocks B x B)
//                    forward (groups = output block columns) and input gradient (groups = input
//                    block rows, w = the blocks transposed)
//   block outer      dw[n] = a[:, row[n]]^T @ b[:, col[n]]                       (weight gradient)
//
// Activations are read in place, row-major, one B-wide strip at a time: nothing is gathered or
// copied. The inner loops keep a tile of rows x B outputs in registers (B is a template
// parameter, so the loops over a block are unrolled). Groups, or blocks, are split evenly over
// XLA's intra-op thread pool plus the calling thread.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// Runs body(begin, end) over `parts` even slices of [0, n) on the pool and the calling thread;
// returns when all are done. Every thread claims unclaimed slices until none are left, so the
// caller never waits on a slice that no thread has started: when the pool's threads are all busy
// (several devices' kernels at once on a simulated mesh, or a caller that is a pool thread), it
// runs every slice itself. A task the pool starts late finds nothing to claim and never touches
// `body`; the shared state outlives this call for it.
template <typename Body>
void ParallelFor(ffi::ThreadPool& pool, int64_t n, Body body) {
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), n));
  struct State {
    std::atomic<int64_t> next{0};
    int64_t finished = 0;
    std::mutex mu;
    std::condition_variable done;
  };
  auto state = std::make_shared<State>();
  auto claim = [state, parts, n, &body] {
    for (int64_t p; (p = state->next.fetch_add(1)) < parts;) {
      body(n * p / parts, n * (p + 1) / parts);
      std::lock_guard<std::mutex> lock(state->mu);
      if (++state->finished == parts) state->done.notify_all();
    }
  };
  for (int64_t p = 1; p < parts; ++p) pool.Schedule(decltype(claim)(claim));  // a copy each
  claim();
  std::unique_lock<std::mutex> lock(state->mu);
  state->done.wait(lock, [&] { return state->finished == parts; });
}

// A row of B floats is B / kWidth<B> vectors (GCC vector extensions: the compiler picks the
// instructions, AVX-512 or AVX2 halves, for -march=native).
typedef float v16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
template <int B> struct Vec { using type = v16; };
template <> struct Vec<8> { using type = v8; };
template <int B> constexpr int kWidth = sizeof(typename Vec<B>::type) / sizeof(float);

// Accumulator vectors an output tile keeps in registers (32 registers with AVX-512, 16 without;
// the rest hold a block row and a broadcast value).
#ifdef __AVX512F__
constexpr int kAccumulators = 16;
#else
constexpr int kAccumulators = 4;
#endif
// Rows of a tile: as many as its accumulators allow.
template <int B> constexpr int kTileRows = std::max(1, kAccumulators / (B / kWidth<B>));

template <typename V>
inline V Load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));  // an unaligned vector load
  return v;
}

// out[0:R, :B] = sum_t a[0:R, src[t]*B:+B] @ w[blk[t]]   (row strides a_stride, out_stride)
template <int B, int R>
inline void ProductTile(const float* a, int64_t a_stride, const float* w, const int32_t* src,
                        const int32_t* blk, int32_t t0, int32_t t1, float* out,
                        int64_t out_stride) {
  using V = typename Vec<B>::type;
  constexpr int W = kWidth<B>, N = B / W;
  V acc[R][N] = {};
  for (int32_t t = t0; t < t1; ++t) {
    const float* x = a + int64_t{src[t]} * B;
    const float* wb = w + int64_t{blk[t]} * B * B;
    for (int k = 0; k < B; ++k) {
      V wk[N];
      for (int v = 0; v < N; ++v) wk[v] = Load<V>(wb + k * B + v * W);
      for (int r = 0; r < R; ++r) {
        const float xv = x[r * a_stride + k];
        for (int v = 0; v < N; ++v) acc[r][v] += xv * wk[v];
      }
    }
  }
  for (int r = 0; r < R; ++r) std::memcpy(out + r * out_stride, acc[r], B * sizeof(float));
}

template <int B>
void GroupedProduct(ffi::ThreadPool& pool, const float* a, int64_t rows, int64_t a_cols,
                    const float* w, const int32_t* ptr, const int32_t* src, const int32_t* blk,
                    int64_t groups, float* out) {
  constexpr int R = kTileRows<B>;
  const int64_t out_cols = groups * B;
  ParallelFor(pool, groups, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      float* o = out + g * B;
      int64_t r = 0;
      for (; r + R <= rows; r += R)
        ProductTile<B, R>(a + r * a_cols, a_cols, w, src, blk, ptr[g], ptr[g + 1],
                          o + r * out_cols, out_cols);
      for (; r < rows; ++r)
        ProductTile<B, 1>(a + r * a_cols, a_cols, w, src, blk, ptr[g], ptr[g + 1],
                          o + r * out_cols, out_cols);
    }
  });
}

// dw[n] = a[:, row[n]*B:+B]^T @ b[:, col[n]*B:+B], K rows of dw[n] at a time in registers.
template <int B>
void BlockOuter(ffi::ThreadPool& pool, const float* a, int64_t a_cols, const float* b,
                int64_t b_cols, int64_t rows, const int32_t* row, const int32_t* col,
                int64_t nnz, float* dw) {
  using V = typename Vec<B>::type;
  constexpr int W = kWidth<B>, N = B / W, K = std::min(B, kTileRows<B>);
  ParallelFor(pool, nnz, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* an = a + int64_t{row[n]} * B;
      const float* bn = b + int64_t{col[n]} * B;
      for (int k0 = 0; k0 < B; k0 += K) {
        V acc[K][N] = {};
        for (int64_t r = 0; r < rows; ++r) {
          const float* ar = an + r * a_cols + k0;
          V br[N];
          for (int v = 0; v < N; ++v) br[v] = Load<V>(bn + r * b_cols + v * W);
          for (int k = 0; k < K; ++k)
            for (int v = 0; v < N; ++v) acc[k][v] += ar[k] * br[v];
        }
        for (int k = 0; k < K; ++k)
          std::memcpy(dw + (n * B + k0 + k) * B, acc[k], B * sizeof(float));
      }
    }
  });
}

// Calls f.template operator()<B>() for the supported block sizes.
template <typename F>
ffi::Error WithBlockSize(int64_t block, F f) {
  switch (block) {
    case 8: f.template operator()<8>(); return ffi::Error::Success();
    case 16: f.template operator()<16>(); return ffi::Error::Success();
    case 32: f.template operator()<32>(); return ffi::Error::Success();
    case 64: f.template operator()<64>(); return ffi::Error::Success();
  }
  return ffi::Error::InvalidArgument("block size must be 8, 16, 32 or 64");
}

ffi::Error GroupedProductImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> a,
                              ffi::Buffer<ffi::F32> w, ffi::Buffer<ffi::S32> ptr,
                              ffi::Buffer<ffi::S32> src, ffi::Buffer<ffi::S32> blk,
                              ffi::ResultBuffer<ffi::F32> out) {
  const auto a_dims = a.dimensions();
  const int64_t block = w.dimensions()[1];
  const int64_t groups = ptr.element_count() - 1;
  return WithBlockSize(block, [&]<int B>() {
    GroupedProduct<B>(pool, a.typed_data(), a_dims[0], a_dims[1], w.typed_data(),
                      ptr.typed_data(), src.typed_data(), blk.typed_data(), groups,
                      out->typed_data());
  });
}

ffi::Error BlockOuterImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::F32> b,
                          ffi::Buffer<ffi::S32> row, ffi::Buffer<ffi::S32> col,
                          ffi::ResultBuffer<ffi::F32> dw) {
  const auto a_dims = a.dimensions();
  const int64_t block = dw->dimensions()[1];
  return WithBlockSize(block, [&]<int B>() {
    BlockOuter<B>(pool, a.typed_data(), a_dims[1], b.typed_data(), b.dimensions()[1],
                  a_dims[0], row.typed_data(), col.typed_data(), row.element_count(),
                  dw->typed_data());
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BlockSparseGroupedProduct, GroupedProductImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(BlockSparseBlockOuter, BlockOuterImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
