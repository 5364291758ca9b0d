// CPU reader of the VecInfer format (kv/formats/vecinfer.h), scalar. Keys: prepare_query maps each
// query head into the coded domain once (q~ = H (lambda * q) / sqrt(d)) and builds its lookup
// table LUT[j][c] = <q~_j, C_j[c]> (d/n x 2^m floats); a key then scores sum_j LUT[j][idx_j]:
// d/n table reads, no multiply. Values: sum_t p_t C_j[idx_j] in the coded domain, mapped back
// (H / sqrt(d)) once by finish_accumulate. No cached token is ever transformed.
#include <algorithm>
#include <atomic>

#include "core/error.h"
#include "kernels/cpu/kv_read_vecinfer.h"
#include "kernels/cpu/kv_reader.h"
#include "kv/formats/vecinfer.h"

namespace vxq::cpu {

namespace {

namespace vi = codecs::vecinfer;

std::atomic<uint64_t> g_lut_builds{0};

const vi::State& state_of(const KvFormatParams& f) {
    VXQ_ASSERT(f.layer_state != nullptr);
    return *static_cast<const vi::State*>(f.layer_state);
}

class VecinferReader final : public KvReader {
public:
    // pq.data: [n_q, d/n, 2^m] lookup tables.
    void prepare_query(const KvFormatParams& f, const float* q, int64_t n_q, int64_t d, PreparedQuery& pq) const override {
        const vi::State& st = state_of(f);
        const vi::Layout& l = st.layout;
        VXQ_ASSERT(d == l.d);
        const int64_t J = l.subvectors(), K = l.centroids();
        pq.q = q;
        pq.buf.resize(size_t(n_q * J * K) * sizeof(float));
        float* lut = reinterpret_cast<float*>(pq.buf.data());
        float qt[vi::kMaxHeadDim];
        for (int64_t h = 0; h < n_q; ++h) {
            const float* qh = q + h * d;
            for (int64_t c = 0; c < d; ++c) qt[c] = st.lambda.empty() ? qh[c] : qh[c] * st.lambda[size_t(c)];
            vi::hadamard(qt, d);
            for (int64_t j = 0; j < J; ++j) {
                const float* C = st.centroids(j);
                const float* qj = qt + j * l.n;
                float* row = lut + (h * J + j) * K;
                for (int64_t c = 0; c < K; ++c) {
                    float s = 0;
                    for (int e = 0; e < l.n; ++e) s += qj[e] * C[c * l.n + e];
                    row[c] = s;
                }
            }
            g_lut_builds.fetch_add(1, std::memory_order_relaxed);
        }
        pq.data = lut;
    }

    void scores(const KvFormatParams& f, const PreparedQuery& q, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d,
                float* s) const override {
        const vi::Layout& l = state_of(f).layout;
        VXQ_ASSERT(d == l.d && q.data != nullptr);
        const int64_t J = l.subvectors(), K = l.centroids();
        const float* lut = static_cast<const float*>(q.data);
        int32_t idx[vi::kMaxHeadDim];
        for (int64_t t = 0; t < n; ++t) {
            const uint8_t* B = blk + size_t(t) * f.block_bytes;
            for (int64_t j = 0; j < J; ++j) idx[j] = int32_t(j * K + vi::index_at(B, j, l.m));
            for (int64_t h = 0; h < n_q; ++h) {
                const float* L = lut + h * J * K;
                float sum = 0;
                for (int64_t j = 0; j < J; ++j) sum += L[idx[j]];
                s[h * n + t] = sum;
            }
        }
    }

    void accumulate(const KvFormatParams& f, const float* p, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d,
                    float* acc) const override {
        const vi::State& st = state_of(f);
        VXQ_ASSERT(d == st.layout.d);
        float y[vi::kMaxHeadDim];
        for (int64_t t = 0; t < n; ++t) {
            vi::coded_vector(st, blk + size_t(t) * f.block_bytes, y);
            for (int64_t h = 0; h < n_q; ++h) {
                const float w = p[h * n + t];
                float* ah = acc + h * d;
                for (int64_t c = 0; c < d; ++c) ah[c] += w * y[c];
            }
        }
    }

    bool own_value_domain() const override { return true; }
    void finish_accumulate(const KvFormatParams& f, float* acc, int64_t n_q, int64_t d) const override {
        const vi::State& st = state_of(f);
        VXQ_ASSERT(st.lambda.empty());  // keys are scored, never accumulated
        for (int64_t h = 0; h < n_q; ++h) vi::hadamard(acc + h * d, d);
    }
};

}  // namespace

uint64_t vecinfer_lut_builds() { return g_lut_builds.load(std::memory_order_relaxed); }

const KvReader* vecinfer_reader(KvFormatKind kind, KvIsa isa) {
    static const VecinferReader scalar;
    // Scalar only (no AVX2 reader yet): kv_reader(kind) picks this one under either setting.
    if (kind != KvFormatKind::VecInfer || isa != KvIsa::Scalar) return nullptr;
    return &scalar;
}

}  // namespace vxq::cpu
