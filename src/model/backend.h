// The ops a forward pass needs. The forward pass (model/llama.cpp) is written once against this
// interface; the CPU backend implements it with kernels/cpu, a CUDA backend will implement it
// with kernels/cuda. Buffers are the backend's own memory (host memory for the CPU backend).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"

namespace vxq {

struct KvLayerView;
class ThreadPool;
using cpu::RopeParams;
using cpu::WeightView;

class Backend {
public:
    virtual ~Backend() = default;
    // Names what actually runs, e.g. "cpu/avx2 x2 threads".
    virtual std::string describe() const = 0;

    // y = x W^T.  x: [n, w.cols]; y: [n, w.rows]
    virtual void matmul(const WeightView& w, const float* x, int64_t n, float* y) = 0;
    // out[i] = row ids[i] of table.  out: [n, table.cols]
    virtual void embed(const WeightView& table, const int32_t* ids, int64_t n, float* out) = 0;
    virtual void rms_norm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps, float* y) = 0;
    virtual void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t pos0, const RopeParams& p) = 0;
    // gate[r][i] = silu(gate[r][i]) * up[r][i] for n_rows rows of n_ff.
    virtual void swiglu(float* gate, const float* up, int64_t n_rows, int64_t n_ff) = 0;
    virtual void add(float* x, const float* y, int64_t n) = 0;
    virtual void add_bias(float* x, const float* b, int64_t n_rows, int64_t dim) = 0;
    // Causal attention of n_q query tokens at positions [pos0, pos0 + n_q) over one layer of the KV
    // cache: query i sees the stored tokens of its KV head at positions <= pos0 + i; scores are
    // scaled by 1/sqrt(head_dim). The backend reads every codec in place through its readers.
    //   q, out: [n_q, n_head, head_dim], q after RoPE
    virtual void attention(const KvLayerView& view, const float* q, int64_t n_q, int64_t pos0, float* out) = 0;
};

std::unique_ptr<Backend> make_cpu_backend(int n_threads);

}  // namespace vxq
