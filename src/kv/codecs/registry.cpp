// The one table of KV methods. A new codec is a row here plus its format file in kv/codecs/ and
// a reader per backend (kernels/cpu/kv_read_*.cpp); nothing else lists codecs.
#include <algorithm>
#include <atomic>

#include "core/error.h"
#include "kv/codecs/codecs.h"

namespace vxq {

namespace {

struct Entry {
    CodecInfo info;
    CodecFactory make;
    LayerStateFactory make_state;
};

std::vector<Entry> builtin_entries() {
    std::vector<Entry> e = {
        {{"f16", "", "IEEE half precision (llama.cpp's default cache)", "16", {"cpu", "cuda"}, {"f16"}}, codecs::make_f16,
         nullptr},
        {{"bf16", "", "bfloat16", "16", {"cpu"}, {"bf16"}}, codecs::make_bf16, nullptr},
        {{"f32", "", "single precision", "32", {"cpu"}, {"f32"}}, codecs::make_f32, nullptr},
        {{"q8_0", "", "llama.cpp q8_0 blocks: 32 int8 + fp16 scale along head_dim", "8.5", {"cpu", "cuda"}, {"q8_0"}},
         codecs::make_q8_0, nullptr},
        {{"q4_0", "", "llama.cpp q4_0 blocks: 32 4-bit codes + fp16 scale along head_dim", "4.5", {"cpu", "cuda"}, {"q4_0"}},
         codecs::make_q4_0, nullptr},
        {{"fp8", "scale=prompt|S (prompt)",
          "e4m3fn, one fp32 scale per (layer, KV head): amax/448 of a prompt of >= 16 tokens, else 1", "8", {"cpu", "cuda"},
          {"fp8", "fp8:scale=0.01"}},
         codecs::make_fp8, nullptr},
        {{"kivi", "bits=2|4|8 (2), group=G (32), residual=R (128, multiple of G)",
          "KIVI: per-channel keys over G tokens, per-token values over G channels, fp16 window of R",
          "b + 32/G (+ the fp16 window of R tokens)", {"cpu", "cuda"},
          {"kivi:bits=2", "kivi:bits=4", "kivi:bits=8,group=64,residual=128", "kivi:bits=2,group=32,residual=32"}},
         codecs::make_kivi, nullptr},
        {{"turbo",
          "bits=1..4 (3), rot=hadamard|haar|calib (hadamard; haar when head_dim is not a power of two), seed=S (0), "
          "calib=FILE (with rot=calib: vxq calibrate --method turbo)",
          "TurboQuant_mse: fp16 norm + seeded rotation + b-bit Lloyd-Max index per coordinate; rot=calib: the layer's "
          "calibrated eigenbasis, b x d bits given out per coordinate by its variance",
          "b + 16/d (+ per layer and role: rotation d or d^2 fp32, codebook 2^(b+1)-1 fp32; rot=calib: codebooks up to "
          "8 bits and 25 bytes per coordinate)",
          {"cpu", "cuda"},
          {"turbo:bits=3", "turbo:bits=1", "turbo:bits=2", "turbo:bits=4", "turbo:bits=3,rot=haar,seed=5",
           "turbo:bits=3,rot=calib,calib=random"}},
         codecs::make_turbo, codecs::make_turbo_state},
        {{"turbo-prod", "bits=1..4 (3), rot, seed as turbo",
          "TurboQuant_prod keys: turbo at b-1 bits + fp16 residual norm + 1-bit QJL sketch (unbiased scores); "
          "values: turbo at b bits",
          "keys b + 32/d, values b + 16/d (+ per layer: rotation, codebooks, keys' d^2 fp32 sketch)", {"cpu", "cuda"},
          {"turbo-prod:bits=3", "turbo-prod:bits=1", "turbo-prod:bits=4,rot=haar"}},
         codecs::make_turbo_prod, codecs::make_turbo_prod_state},
        {{"turbo-rvq", "bits=1..4 per stage (3), rot, seed as turbo",
          "TurboQuant_rvq: two Lloyd-Max stages of b bits, the second fitted to the first one's residual",
          "2b + 16/d (+ per layer: rotation, two codebooks)", {"cpu", "cuda"}, {"turbo-rvq:bits=3", "turbo-rvq:bits=1"}},
         codecs::make_turbo_rvq, codecs::make_turbo_rvq_state},
        {{"vecinfer", "n=1..64 (4), m=1..8 (8), calib=FILE (vxq calibrate) | random (tests only)",
          "VecInfer: keys smoothed by calibrated lambda, Walsh-Hadamard, product quantizer of n-element sub-vectors "
          "with 2^m k-means centroids per sub-space; values the same without smoothing",
          "m/n (+ per layer and role: codebooks d*2^m fp32, keys' lambda d fp32)", {"cpu", "cuda"},
          {"vecinfer:n=4,m=8,calib=random", "vecinfer:n=2,m=5,calib=random", "vecinfer:n=8,m=8,calib=random"}},
         codecs::make_vecinfer, codecs::make_vecinfer_state},
        {{"qjl", "m=M (2d), mo=M_o (d) (multiples of 8; defaults rounded up), outliers=O (8), residual=R (32, multiple of 32), seed=S (0)",
          "QJL keys: per 32-token block the O largest-norm channels apart; per token fp16 norms of both parts + "
          "sign(S k_in) (m bits) + sign(S_o k_out) (m_o bits), unbiased scores; values: KIVI-2 per token, G=32",
          "keys (m + m_o + 32 + O/4)/d, values 3 (+ fp16 window of R tokens; + per layer: keys' (m + m_o) d fp32 "
          "sketches)",
          {"cpu", "cuda"},
          {"qjl", "qjl:outliers=0", "qjl:m=72,mo=24,outliers=3,seed=7", "qjl:residual=64"}},
         codecs::make_qjl, codecs::make_qjl_state},
    };
    // Without the CUDA backend in the build (VXQ_CUDA) no row names it, as in the weight-format
    // table: every name listed is one make_backend accepts.
    if (!VXQ_HAVE_CUDA) {
        for (Entry& row : e) std::erase(row.info.backends, "cuda");
    }
    return e;
}

std::vector<Entry>& entries() {
    static std::vector<Entry> e = builtin_entries();
    return e;
}

const Entry& find(const CodecSpec& spec) {
    for (const auto& e : entries()) {
        if (e.info.name == spec.name) return e;
    }
    std::string names;
    for (const auto& e : entries()) names += (names.empty() ? "" : ", ") + e.info.name;
    fail("unknown KV cache method '{}' (available: {})", spec.name, names);
}

}  // namespace

std::unique_ptr<Codec> make_codec(const CodecSpec& spec, KvRole role, int64_t head_dim, const KvLayerState* state) {
    return find(spec).make(spec, role, head_dim, state);
}

KvLayerState::KvLayerState() {
    static std::atomic<uint64_t> next{1};
    id_ = next.fetch_add(1, std::memory_order_relaxed);
}

std::unique_ptr<KvLayerState> make_layer_state(const CodecSpec& spec, KvRole role, int64_t head_dim, int64_t layer) {
    const Entry& e = find(spec);
    return e.make_state ? e.make_state(spec, role, head_dim, layer) : nullptr;
}

void register_codec(CodecInfo info, CodecFactory make, LayerStateFactory make_state) {
    if (info.variants.empty()) info.variants = {info.name};
    if (info.name.empty() || info.name.find_first_of(":,/=") != std::string::npos) {
        fail("cannot register KV method '{}': a name is non-empty and has none of ':,/='", info.name);
    }
    for (const auto& e : entries()) {
        if (e.info.name == info.name) fail("KV method '{}' is already registered", info.name);
    }
    entries().push_back({info, make, make_state});
}

bool codec_has_reader(const std::string& method, std::string_view backend) {
    const std::vector<std::string>& b = find(CodecSpec{method, {}}).info.backends;
    return std::find(b.begin(), b.end(), backend) != b.end();
}

std::vector<CodecInfo> list_codecs() {
    std::vector<CodecInfo> out;
    for (const auto& e : entries()) out.push_back(e.info);
    return out;
}

const char* kv_format_kind_name(KvFormatKind k) {
    switch (k) {
        case KvFormatKind::F32: return "f32";
        case KvFormatKind::F16: return "f16";
        case KvFormatKind::BF16: return "bf16";
        case KvFormatKind::Q8_0: return "q8_0";
        case KvFormatKind::Q4_0: return "q4_0";
        case KvFormatKind::FP8: return "fp8";
        case KvFormatKind::KiviKey: return "kivi-key";
        case KvFormatKind::KiviValue: return "kivi-value";
        case KvFormatKind::TurboMse: return "turbo-mse";
        case KvFormatKind::TurboProd: return "turbo-prod";
        case KvFormatKind::TurboRvq: return "turbo-rvq";
        case KvFormatKind::VecInfer: return "vecinfer";
        case KvFormatKind::Qjl: return "qjl";
    }
    return "?";
}

}  // namespace vxq
