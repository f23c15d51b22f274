// veloxquant_mlx's CPU kernels, two MLX primitives: x times a packed matrix, as
// mx.quantized_matmul(x, w, scales, biases, transpose=False), and a softmax over the last axis, as mx.softmax.
// Explained, built and tested in nbs/03a4_native.ipynb; built at first use by veloxquant_mlx.native.
#include <nanobind/nanobind.h>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>
#include "mlx/mlx.h"
#include "mlx/primitives.h"
#include "mlx/backend/cpu/encoder.h"

namespace nb = nanobind;
using namespace nb::literals;
namespace mx = mlx::core;

// Groups g0..g1 of one matrix: out[m, n] = sum_k x[m, k] * (s[k, n / G] * w[k, n] + b[k, n / G]), w packed along n
// (element n of a group sits in word n / PER at shift BITS * (n % PER)). The accumulator holds a group's elements in
// (shift, word) order, so the innermost loop runs over words with one shift (it vectorises); the order is undone once
// at the end. The bias term is one sum per (row, group).
template <int BITS, int G>
static void packed_groups(const float* x, const uint32_t* wq, const float* s, const float* b, float* out,
                          int M, int K, int N, int g0, int g1, float* acc) {
  constexpr int PER = 32 / BITS, W = G / PER;
  constexpr uint32_t MASK = (1u << BITS) - 1;
  const int NG = N / G, WN = N / PER, ng = g1 - g0;
  std::memset(acc, 0, sizeof(float) * (size_t)M * ng * (G + 1));
  float* bias = acc + (size_t)M * ng * G;
  for (int k = 0; k < K; ++k) {
    const uint32_t* wrow = wq + (size_t)k * WN;
    for (int g = g0; g < g1; ++g) {
      const uint32_t* wg = wrow + (size_t)g * W;
      const float sc = s[(size_t)k * NG + g], bc = b[(size_t)k * NG + g];
      float f[G];
      for (int e = 0; e < PER; ++e)
        for (int j = 0; j < W; ++j) f[e * W + j] = (float)((wg[j] >> (BITS * e)) & MASK);
      for (int m = 0; m < M; ++m) {
        const float xm = x[(size_t)m * K + k], a = xm * sc;
        float* o = acc + ((size_t)m * ng + (g - g0)) * G;
        for (int i = 0; i < G; ++i) o[i] += a * f[i];
        bias[(size_t)m * ng + (g - g0)] += xm * bc;
      }
    }
  }
  for (int m = 0; m < M; ++m)
    for (int g = g0; g < g1; ++g) {
      const float* o = acc + ((size_t)m * ng + (g - g0)) * G;
      const float bb = bias[(size_t)m * ng + (g - g0)];
      float* dst = out + (size_t)m * N + (size_t)g * G;
      for (int e = 0; e < PER; ++e)
        for (int j = 0; j < W; ++j) dst[j * PER + e] = o[e * W + j] + bb;
    }
}

template <int BITS>
static void packed_bits(const float* x, const uint32_t* wq, const float* s, const float* b, float* out,
                        int M, int K, int N, int G, int g0, int g1, float* acc) {
  if (G == 32) packed_groups<BITS, 32>(x, wq, s, b, out, M, K, N, g0, g1, acc);
  else if (G == 64) packed_groups<BITS, 64>(x, wq, s, b, out, M, K, N, g0, g1, acc);
  else packed_groups<BITS, 128>(x, wq, s, b, out, M, K, N, g0, g1, acc);
}

// A row-contiguous copy of a strided view of 4-byte elements (float32, uint32), made inside the dispatched task: runs
// along the last axis at once when it is contiguous (a slice of a step's weights), element by element otherwise.
static void dense_copy(const uint32_t* src, uint32_t* dst, const mx::Shape& shape, const mx::Strides& strides) {
  const int nd = (int)shape.size();
  const int64_t run = (nd && strides[nd - 1] == 1) ? shape[nd - 1] : 1;   // elements copied at once
  const int outer = run > 1 ? nd - 1 : nd;                                 // the axes walked one index at a time
  std::vector<int> idx(nd, 0);
  size_t total = 1;
  for (int d = 0; d < outer; ++d) total *= (size_t)shape[d];
  for (size_t i = 0; i < total; ++i, dst += run) {
    int64_t off = 0;
    for (int d = 0; d < outer; ++d) off += (int64_t)idx[d] * strides[d];
    if (run > 1) std::memcpy(dst, src + off, sizeof(uint32_t) * run);
    else *dst = src[off];
    for (int d = outer - 1; d >= 0 && ++idx[d] == shape[d]; --d) idx[d] = 0;
  }
}

// The inputs as row-contiguous arrays: a strided one gets a buffer of its own, filled by a copy dispatched before the
// kernel's task, so the kernel reads every input dense.
static std::vector<mx::array> dense_inputs(mx::cpu::CommandEncoder& enc, const std::vector<mx::array>& inputs) {
  std::vector<mx::array> in;
  for (auto& a : inputs) {
    enc.set_input_array(a);
    if (a.flags().row_contiguous) {
      in.push_back(a);
      continue;
    }
    in.push_back(mx::array(a.shape(), a.dtype(), nullptr, {}));
    in.back().set_data(mx::allocator::malloc(in.back().nbytes()));
    enc.add_temporary(in.back());
    enc.dispatch([src = a.data<uint32_t>(), dst = in.back().data<uint32_t>(), shape = a.shape(),
                  strides = a.strides()]() { dense_copy(src, dst, shape, strides); });
  }
  return in;
}

class PackedMatmul : public mx::UnaryPrimitive {
 public:
  PackedMatmul(mx::Stream s, int bits, int group, int threads)
      : mx::UnaryPrimitive(s), bits_(bits), group_(group), threads_(threads) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    auto& enc = mx::cpu::get_command_encoder(stream());
    const std::vector<mx::array> in = dense_inputs(enc, inputs);
    out.set_data(mx::allocator::malloc(out.nbytes()));
    enc.set_output_array(out);
    if (out.size() == 0) return;                   // nothing to write
    if (inputs[0].size() == 0) {                   // K == 0: every sum is empty
      enc.dispatch([op = out.data<float>(), n = out.size()]() { std::memset(op, 0, n * sizeof(float)); });
      return;
    }
    const int M = in[0].shape(-2), K = in[0].shape(-1), N = out.shape(-1), G = group_, bits = bits_;
    const size_t batch = in[0].size() / ((size_t)M * K), NG = N / G, items = batch * NG;
    const int threads = (int)std::min<size_t>(std::max(threads_, 1), items);
    enc.dispatch([xp = in[0].data<float>(), wp = in[1].data<uint32_t>(), sp = in[2].data<float>(),
                  bp = in[3].data<float>(), op = out.data<float>(), M, K, N, G, bits, NG, items, threads]() {
      auto run = [=](size_t lo, size_t hi) {      // (matrix, group) items lo..hi
        std::vector<float> acc((size_t)M * (NG + 1) * (G + 1));
        for (size_t it = lo; it < hi;) {
          const size_t i = it / NG, g0 = it % NG, g1 = std::min(NG, g0 + (hi - it));
          const float* x = xp + i * M * K;
          const uint32_t* w = wp + i * K * ((size_t)N * bits / 32);
          const float* s = sp + i * K * NG;
          const float* b = bp + i * K * NG;
          float* o = op + i * M * N;
          if (bits == 4) packed_bits<4>(x, w, s, b, o, M, K, N, G, (int)g0, (int)g1, acc.data());
          else if (bits == 8) packed_bits<8>(x, w, s, b, o, M, K, N, G, (int)g0, (int)g1, acc.data());
          else packed_bits<2>(x, w, s, b, o, M, K, N, G, (int)g0, (int)g1, acc.data());
          it += g1 - g0;
        }
      };
      if (threads <= 1) return run(0, items);
      std::vector<std::thread> more;
      for (int t = 1; t < threads; ++t) more.emplace_back(run, items * t / threads, items * (t + 1) / threads);
      run(0, items / threads);
      for (auto& t : more) t.join();
    });
  }
  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("veloxquant_mlx packed_matmul runs on the CPU only");
  }
  const char* name() const override { return "PackedMatmul"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& p = static_cast<const PackedMatmul&>(other);
    return bits_ == p.bits_ && group_ == p.group_ && threads_ == p.threads_;
  }

 private:
  int bits_, group_, threads_;
};

// Checked by the Python wrapper (veloxquant_mlx.native.packed_matmul): float32 x, scales and biases, uint32 packed,
// the same leading (batch) shape, bits 2, 4 or 8, groups of 32, 64 or 128 dividing n, on the CPU.
mx::array packed_matmul(const mx::array& x, const mx::array& w, const mx::array& scales, const mx::array& biases,
                        int bits, int group_size, int threads) {
  auto stream = mx::to_stream({});               // the default device: the wrapper calls this on the CPU only
  auto shape = x.shape();
  shape.back() = (int)((size_t)w.shape(-1) * 32 / bits);
  return mx::array(shape, mx::float32, std::make_shared<PackedMatmul>(stream, bits, group_size, threads),
                   {x, w, scales, biases});
}

// exp(x) for the softmax's shifted logits (x <= 0), written so that a loop over it vectorises: x = n ln2 + r with
// |r| <= ln2 / 2, exp(r) by Cephes' degree-7 polynomial, 2^n put in the exponent bits. Below -87 (float's exp
// underflows there; -inf included) it is 0; NaN stays NaN.
static inline float exp_nonpositive(float x) {
  constexpr float LOG2E = 1.44269504088896341f, LN2_HI = 0.693359375f, LN2_LO = -2.12194440e-4f;
  constexpr float ROUND = 12582912.0f;                        // 1.5 * 2^23: adding it rounds to an integer
  const float xc = x < -87.0f ? -87.0f : x;                   // (NaN passes: the comparison is false)
  const float t = xc * LOG2E + ROUND, n = t - ROUND;
  const float r = (xc - n * LN2_HI) - n * LN2_LO;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t e = (std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(ROUND) + 127) << 23;
  const float v = p * std::bit_cast<float>(e);
  return x < -87.0f ? 0.0f : v;
}

// One row of n logits into n weights: the max, the exponentials and their sum (16 partial sums, so the loops
// vectorise), the scaling.
static void softmax_row(const float* x, float* y, int n) {
  constexpr int L = 16;
  float mx_[L], sm[L];
  for (int j = 0; j < L; ++j) mx_[j] = -INFINITY, sm[j] = 0.0f;
  int i = 0;
  for (; i + L <= n; i += L)
    for (int j = 0; j < L; ++j) mx_[j] = x[i + j] > mx_[j] ? x[i + j] : mx_[j];
  float m = -INFINITY;
  for (int j = 0; j < L; ++j) m = mx_[j] > m ? mx_[j] : m;
  for (int k = i; k < n; ++k) m = x[k] > m ? x[k] : m;
  for (int k = 0; k < n; ++k) y[k] = exp_nonpositive(x[k] - m);
  for (i = 0; i + L <= n; i += L)
    for (int j = 0; j < L; ++j) sm[j] += y[i + j];
  float s = 0.0f;
  for (int j = 0; j < L; ++j) s += sm[j];
  for (int k = i; k < n; ++k) s += y[k];
  const float inv = 1.0f / s;
  for (int k = 0; k < n; ++k) y[k] *= inv;
}

class Softmax : public mx::UnaryPrimitive {
 public:
  explicit Softmax(mx::Stream s) : mx::UnaryPrimitive(s) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    auto& enc = mx::cpu::get_command_encoder(stream());
    const mx::array in = dense_inputs(enc, inputs)[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    enc.set_output_array(out);
    if (out.size() == 0) return;
    const int n = in.shape(-1);
    const size_t rows = in.size() / n;
    enc.dispatch([xp = in.data<float>(), yp = out.data<float>(), n, rows]() {
      for (size_t r = 0; r < rows; ++r) softmax_row(xp + r * n, yp + r * n, n);
    });
  }
  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("veloxquant_mlx softmax runs on the CPU only");
  }
  const char* name() const override { return "VeloxSoftmax"; }
  bool is_equivalent(const mx::Primitive&) const override { return true; }
};

// Checked by the Python wrapper (veloxquant_mlx.native.softmax): float32, at least one element on the last axis.
mx::array softmax(const mx::array& x) {
  return mx::array(x.shape(), mx::float32, std::make_shared<Softmax>(mx::to_stream({})), {x});
}

NB_MODULE(_kernels, m) {
  m.def("packed_matmul", &packed_matmul, "x"_a, "w"_a, "scales"_a, "biases"_a, "bits"_a, "group_size"_a,
        "threads"_a = 1);
  m.def("softmax", &softmax, "x"_a);
}
