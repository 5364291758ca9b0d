// Baseline KV codecs: the plain caches (f32, f16, bf16), llama.cpp's q8_0 / q4_0 blocks and fp8
// e4m3fn with one scale per stream. All are token-wise (block_tokens = flush_at = flush_count = 1)
// and take no options but fp8's scale. Formats and rounding rules: kv/formats/baseline.h.
#include <cmath>
#include <cstdlib>
#include <memory>
#include <type_traits>

#include "core/error.h"
#include "kv/codecs/codecs.h"
#include "kv/codecs/option_parse.h"
#include "kv/formats/baseline.h"

namespace vxq::codecs {

namespace {

using namespace kvfmt;

constexpr int64_t kFp8MinPromptTokens = 16;  // shorter prompts do not set fp8's scale

template <class F> constexpr KvFormatKind kKind = KvFormatKind::F32;
template <> constexpr KvFormatKind kKind<F16> = KvFormatKind::F16;
template <> constexpr KvFormatKind kKind<BF16> = KvFormatKind::BF16;
template <> constexpr KvFormatKind kKind<Q8_0> = KvFormatKind::Q8_0;
template <> constexpr KvFormatKind kKind<Q4_0> = KvFormatKind::Q4_0;
template <> constexpr KvFormatKind kKind<FP8> = KvFormatKind::FP8;

template <class F>
class Baseline final : public Codec {
public:
    std::string spec() const override {
        if (fixed_scale_) return fmt::format("{}:scale={}", F::kName, scale_);
        return F::kName;
    }
    size_t block_bytes(int64_t head_dim) const override { return F::bytes(head_dim); }

    // fp8: scale = amax / 448 of the prompt (METHODS.md), when the prompt is a sample worth
    // calibrating on (>= kFp8MinPromptTokens tokens); a shorter one (a lone BOS when text is fed
    // token by token) keeps scale 1, the uncalibrated default vLLM also uses, since one token's
    // amax would clip every larger later value. A fixed `scale=` option skips calibration.
    void observe_first_batch(const float* x, int64_t n, int64_t head_dim) override {
        if constexpr (std::is_same_v<F, FP8>) {
            if (fixed_scale_ || n < kFp8MinPromptTokens) return;
            float amax = 0.0f;
            for (int64_t i = 0; i < n * head_dim; ++i) {
                if (std::isfinite(x[i])) amax = std::max(amax, std::fabs(x[i]));
            }
            const float sc = amax / 448.0f;
            scale_ = sc > 0.0f ? sc : 1.0f;
        }
    }
    bool wants_first_batch(int64_t n) const override {
        return std::is_same_v<F, FP8> && !fixed_scale_ && n >= kFp8MinPromptTokens;
    }
    void set_fixed_scale(float s) {
        scale_ = s;
        fixed_scale_ = true;
    }

    void encode(const float* x, int64_t head_dim, uint8_t* block) const override {
        F::encode(x, head_dim, block, scale_);
    }
    void decode(const uint8_t* block, int64_t head_dim, float* x) const override {
        for (int64_t c0 = 0; c0 < head_dim; c0 += kChunk) {
            F::decode_range(block, c0, std::min(kChunk, head_dim - c0), x + c0, scale_);
        }
    }
    KvFormatParams params(int64_t head_dim) const override {
        KvFormatParams p;
        p.kind = kKind<F>;
        p.block_tokens = 1;
        p.block_bytes = F::bytes(head_dim);
        p.scale = scale_;
        return p;
    }

private:
    float scale_ = 1.0f;  // fp8 only
    bool fixed_scale_ = false;
};

template <class F>
std::unique_ptr<Codec> make(const CodecSpec& spec, int64_t head_dim) {
    if constexpr (std::is_same_v<F, FP8>) {
        check_known_options(spec, {"scale"});
    } else {
        check_known_options(spec, {});
    }
    if (head_dim <= 0) fail("KV method '{}': head_dim must be positive (got {})", spec.name, head_dim);
    if (F::kBlocks32 && head_dim % 32 != 0) {
        fail("KV method '{}' needs head_dim divisible by 32 (blocks of 32 values), got head_dim {}", spec.name,
             head_dim);
    }
    auto codec = std::make_unique<Baseline<F>>();
    if constexpr (std::is_same_v<F, FP8>) {
        const auto it = spec.options.find("scale");
        if (it != spec.options.end() && it->second != "prompt") {
            char* end = nullptr;
            const float s = std::strtof(it->second.c_str(), &end);
            if (it->second.empty() || *end != '\0' || !std::isfinite(s) || s <= 0.0f) {
                fail("KV method 'fp8': scale must be 'prompt' or a positive number, got '{}'", it->second);
            }
            codec->set_fixed_scale(s);
        }
    }
    return codec;
}

}  // namespace

std::unique_ptr<Codec> make_f32(const CodecSpec& s, KvRole, int64_t d, const KvLayerState*) { return make<F32>(s, d); }
std::unique_ptr<Codec> make_f16(const CodecSpec& s, KvRole, int64_t d, const KvLayerState*) { return make<F16>(s, d); }
std::unique_ptr<Codec> make_bf16(const CodecSpec& s, KvRole, int64_t d, const KvLayerState*) { return make<BF16>(s, d); }
std::unique_ptr<Codec> make_q8_0(const CodecSpec& s, KvRole, int64_t d, const KvLayerState*) { return make<Q8_0>(s, d); }
std::unique_ptr<Codec> make_q4_0(const CodecSpec& s, KvRole, int64_t d, const KvLayerState*) { return make<Q4_0>(s, d); }
std::unique_ptr<Codec> make_fp8(const CodecSpec& s, KvRole, int64_t d, const KvLayerState*) { return make<FP8>(s, d); }

}  // namespace vxq::codecs
