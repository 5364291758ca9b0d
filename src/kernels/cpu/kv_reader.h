// How the fused CPU attention reads a KV stream: a reader per format kind (kv/format.h) scores
// keys or accumulates values straight from the packed bytes, one virtual call per run of whole
// blocks (up to a chunk of >= 64 tokens), for all query heads that share the KV head (GQA: the
// bytes are read once). Readers are stateless; what varies per stream (fp8's scale, KIVI's bits)
// comes in the KvFormatParams. A key reader may prepare the query once per (query token, KV head
// group) and step (q8_0 / q4_0 keys quantize it to q8_0), never per cached token.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kv/format.h"

namespace vxq::cpu {

// A query as a key reader wants it.   q: [n_q, head_dim]; data: the reader's own form of it
struct PreparedQuery {
    const float* q = nullptr;
    const void* data = nullptr;
    std::vector<uint8_t> buf;  // backing store of `data`, reused across calls
};

class KvReader {
public:
    virtual ~KvReader() = default;
    virtual void prepare_query(const KvFormatParams& f, const float* q, int64_t n_q, int64_t d, PreparedQuery& pq) const {
        pq.q = q;
        pq.data = nullptr;
    }
    // s[h * n + t] = <q_h, k_t> for heads h < n_q and the n tokens of n / block_tokens
    // consecutive blocks starting at blk.   s: [n_q, n]
    virtual void scores(const KvFormatParams& f, const PreparedQuery& q, int64_t n_q, const uint8_t* blk, int64_t n,
                        int64_t d, float* s) const = 0;
    // acc[h * head_dim + c] += sum_t p[h * n + t] * v_t[c].   p: [n_q, n]; acc: [n_q, head_dim]
    virtual void accumulate(const KvFormatParams& f, const float* p, int64_t n_q, const uint8_t* blk, int64_t n,
                            int64_t d, float* acc) const = 0;

    // Values whose reader accumulates in a domain of its own (TurboQuant: the rotated one) say
    // so here, and `finish_accumulate` maps such an accumulator back in place, once per (query,
    // KV head group, split) after the weighted sum: never per cached token. The kernel sums the
    // stream's window tokens (fp16 / exact f32, in the model's domain) apart and adds them after.
    // acc: [n_q, head_dim]
    virtual bool own_value_domain() const { return false; }
    // Whether this reader takes its scalar code for these blocks although it is an AVX2 reader
    // (TurboQuant_prod keys): the code path a run reports names what it ran.
    virtual bool scalar_blocks(const KvFormatParams& f, bool key) const { return false; }
    virtual void finish_accumulate(const KvFormatParams& f, float* acc, int64_t n_q, int64_t d) const {}

    // prepare_query + scores, for tests and one-off calls.
    void scores_of(const KvFormatParams& f, const float* q, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d,
                   float* s) const {
        PreparedQuery pq;
        prepare_query(f, q, n_q, d, pq);
        scores(f, pq, n_q, blk, n, d, s);
    }
};

enum class KvIsa { Scalar, Avx2 };

// The reader of a format kind for an instruction set; nullptr when there is none (an AVX2
// reader on a CPU without AVX2 + FMA + F16C, or a kind with no CPU reader).
const KvReader* kv_reader(KvFormatKind kind, KvIsa isa);
// The fastest reader this CPU runs (the scalar one under VXQ_KV_ISA=scalar); vxq::Error naming
// the kind if none.
const KvReader& kv_reader(KvFormatKind kind);
// The instruction set kv_reader(f.kind) runs for blocks of f (keys or values).
KvIsa kv_reader_isa(const KvFormatParams& f, bool key);
// VXQ_KV_ISA=scalar: the fused attention reads every KV format with its scalar reader (the A/B of
// an AVX2 reader against its reference in benchmarks); unset or "auto": the fastest. Read once;
// vxq::Error on any other value.
bool kv_scalar_forced();
// AVX2 + FMA + F16C present (every AVX2 reader and the parity attention check this).
bool kv_avx2_available();

// Per-kind reader tables, one per reader file (kv_read_baseline.cpp, kv_read_kivi.cpp,
// kv_read_turbo.cpp, kv_read_vecinfer.cpp, kv_read_qjl.cpp).
const KvReader* baseline_reader(KvFormatKind kind, KvIsa isa);
const KvReader* kivi_reader(KvFormatKind kind, KvIsa isa);
const KvReader* turbo_reader(KvFormatKind kind, KvIsa isa);
const KvReader* vecinfer_reader(KvFormatKind kind, KvIsa isa);  // kv_read_vecinfer.cpp
const KvReader* qjl_reader(KvFormatKind kind, KvIsa isa);       // kv_read_qjl.cpp

}  // namespace vxq::cpu
