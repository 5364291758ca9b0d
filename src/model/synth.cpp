#include "model/synth.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <set>
#include <thread>

#include "core/error.h"
#include "core/splitmix.h"
#include "core/thread_pool.h"
#include "formats/ggml_quants.h"
#include "formats/tokenizer.h"
#include "formats/unicode.h"

namespace vxq {

namespace {

// One row per shape. Numbers are the models' published config.json values on Hugging Face
// (hidden_size, num_hidden_layers, num_attention_heads / num_key_value_heads, intermediate_size,
// vocab_size, max_position_embeddings, rope_theta, rms_norm_eps, tie_word_embeddings, bos/eos
// token ids); the pre-tokenizer is the one llama.cpp's converter writes for the family.
//   name          arch     embd layers heads kv   ff     vocab   ctx     theta  eps   tied  bias
constexpr ModelShape kShapes[] = {
    // meta-llama/Meta-Llama-3-8B
    {"llama3-8b", "llama", 4096, 32, 32, 8, 14336, 128256, 8192, 500000.0f, 1e-5f, false, false,
     "llama-bpe", 128000, 128001, "<|begin_of_text|>", "<|end_of_text|>", true},
    // meta-llama/Llama-3.2-1B (its rope_scaling "llama3", factor 32, is not written: llama.cpp
    // stores it as a rope_freqs tensor, which veloxquant does not run; it changes no tensor size)
    {"llama3.2-1b", "llama", 2048, 16, 32, 8, 8192, 128256, 131072, 500000.0f, 1e-5f, true, false,
     "llama-bpe", 128000, 128001, "<|begin_of_text|>", "<|end_of_text|>", true},
    // Qwen/Qwen2.5-7B-Instruct (qkv bias: Qwen2's attention always has it)
    {"qwen2.5-7b", "qwen2", 3584, 28, 28, 4, 18944, 152064, 32768, 1000000.0f, 1e-6f, false, true,
     "qwen2", 151643, 151645, "<|endoftext|>", "<|im_end|>", false},
    // meta-llama/Meta-Llama-3-70B
    {"llama3-70b", "llama", 8192, 80, 64, 8, 28672, 128256, 8192, 500000.0f, 1e-5f, false, false,
     "llama-bpe", 128000, 128001, "<|begin_of_text|>", "<|end_of_text|>", true},
    // No published model: shapes small enough for unit tests (head_dim 32, GQA 2), one per
    // code path: Llama-3-like, and Qwen2-like with qkv bias and tied embeddings.
    {"tiny", "llama", 128, 2, 4, 2, 256, 512, 2048, 500000.0f, 1e-5f, false, false,
     "llama-bpe", 510, 511, "<|begin_of_text|>", "<|end_of_text|>", true},
    {"tiny-qwen2", "qwen2", 128, 2, 4, 2, 256, 512, 2048, 1000000.0f, 1e-6f, true, true,
     "qwen2", 510, 511, "<|endoftext|>", "<|im_end|>", false},
};

uint64_t fnv1a(std::string_view s) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
    return h;
}

// Row `row` of a tensor: N(0, stddev^2) values by Box-Muller from a stream that depends only on
// (seed, tensor name, row), so the file is the same whatever the chunking and thread count.
void normal_row(uint64_t seed, uint64_t name_hash, int64_t row, float stddev, float* x, int64_t n) {
    uint64_t s = seed * 0xD1B54A32D192ED03ull ^ name_hash ^ (uint64_t(row) * 0x9E3779B97F4A7C15ull);
    for (int64_t i = 0; i < n; i += 2) {
        const uint64_t r = splitmix64(s);
        const float u1 = (float(uint32_t(r >> 40)) + 0.5f) * 0x1p-24f;  // (0, 1): log is finite
        const float u2 = float(uint32_t(r) >> 8) * 0x1p-24f;             // [0, 1)
        const float mag = stddev * std::sqrt(-2.0f * std::log(u1));
        const float a = 2.0f * std::numbers::pi_v<float> * u2;
        x[i] = mag * std::cos(a);
        if (i + 1 < n) x[i + 1] = mag * std::sin(a);
    }
}

// A byte-level BPE vocabulary llama.cpp and veloxquant both accept: the 256 characters of GPT-2's
// byte-to-unicode map, a few merged words, filler tokens " tok<N>" (normal tokens, so sampled
// ids print as text), and BOS/EOS as control tokens.
struct SynthVocab {
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    std::vector<std::string> merges;
};

SynthVocab make_vocab(const ModelShape& s) {
    SynthVocab v;
    v.tokens.resize(size_t(s.n_vocab));
    v.types.assign(size_t(s.n_vocab), int32_t(TokenType::Normal));
    std::vector<bool> used(size_t(s.n_vocab), false);
    auto put = [&](int64_t id, std::string text, TokenType type) {
        v.tokens[size_t(id)] = std::move(text);
        v.types[size_t(id)] = int32_t(type);
        used[size_t(id)] = true;
    };
    put(s.bos, std::string(s.bos_text), TokenType::Control);
    put(s.eos, std::string(s.eos_text), TokenType::Control);
    int64_t next = 0;
    auto append = [&](std::string text) {
        while (used[size_t(next)]) ++next;
        put(next, std::move(text), TokenType::Normal);
    };
    for (int b = 0; b < 256; ++b) append(byte_unicode::encode_byte(uint8_t(b)));
    const std::string space = byte_unicode::encode_byte(' ');
    std::set<std::string> have(v.tokens.begin(), v.tokens.begin() + 256);
    for (const char* w : {"the", "and", "of", "to", "in", "is", "hello", "world", "model", "fast"}) {
        std::string left = space;
        for (const char* c = w; *c; ++c) {
            const std::string merged = left + *c;
            if (have.insert(merged).second) {
                v.merges.push_back(left + " " + *c);
                append(merged);
            }
            left = merged;
        }
    }
    for (int64_t k = 0; next < s.n_vocab; ++k) {
        while (next < s.n_vocab && used[size_t(next)]) ++next;
        if (next < s.n_vocab) append(space + "tok" + std::to_string(k));
    }
    return v;
}

}  // namespace

std::span<const ModelShape> model_shapes() { return kShapes; }

const ModelShape* find_model_shape(std::string_view name) {
    for (const ModelShape& s : kShapes) {
        if (s.name == name) return &s;
    }
    return nullptr;
}

std::optional<GgmlType> synth_weight_type(std::string_view name) {
    for (GgmlType t : {GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::TQ2_0, GgmlType::TQ2_G128}) {
        if (ggml_type_name(t) == name) return t;
    }
    return std::nullopt;
}

SynthModel::SynthModel(const SynthOptions& o) : opts_(o) {
    const ModelShape* base = find_model_shape(o.shape);
    if (!base) {
        std::string known;
        for (const ModelShape& s : kShapes) known += fmt::format("{}{}", known.empty() ? "" : ", ", s.name);
        fail("unknown shape '{}' (known: {})", o.shape, known);
    }
    if (!synth_weight_type(ggml_type_name(o.type))) {
        fail("synth writes f16, q8_0, q4_0, tq2_0 or tq2_g128 weights, not {}", ggml_type_name(o.type));
    }
    shape_ = *base;
    if (o.n_layer < 0 || o.n_layer > 4096) fail("--layers {} is out of range [1, 4096]", o.n_layer);
    if (o.n_layer > 0) shape_.n_layer = o.n_layer;
    if (o.n_vocab != 0) {
        if (o.n_vocab < kSynthMinVocab || o.n_vocab > base->n_vocab) {
            fail("--vocab {} is out of range [{}, {}] for {}", o.n_vocab, kSynthMinVocab, base->n_vocab, base->name);
        }
        shape_.n_vocab = o.n_vocab;
        if (shape_.bos >= o.n_vocab || shape_.eos >= o.n_vocab) {
            shape_.bos = int32_t(o.n_vocab - 2);
            shape_.eos = int32_t(o.n_vocab - 1);
        }
    }
    const ModelShape& s = shape_;
    dims_.arch = std::string(s.arch);
    dims_.n_vocab = s.n_vocab;
    dims_.n_embd = s.n_embd;
    dims_.n_layer = s.n_layer;
    dims_.n_head = s.n_head;
    dims_.n_head_kv = s.n_head_kv;
    dims_.head_dim = s.n_embd / s.n_head;
    dims_.n_ff = s.n_ff;
    const int64_t head_dim = dims_.head_dim, q_dim = dims_.q_dim(), kv_dim = dims_.kv_dim();
    if ((o.type == GgmlType::TQ2_0 || o.type == GgmlType::TQ2_G128) &&
        (s.n_embd % kQK_K != 0 || s.n_ff % kQK_K != 0 || q_dim % kQK_K != 0)) {
        fail("--type {}: every matrix row must be whole 256-value blocks; {} has rows of {}, {} and {}", ggml_type_name(o.type),
             s.name, s.n_embd, s.n_ff, q_dim);
    }

    GgufStreamWriter& w = file_;
    const std::string a(s.arch);
    w.add_string("general.architecture", a);
    w.add_string("general.name", fmt::format("synth {} {} seed {}", s.name, ggml_type_name(o.type), o.seed));
    if (const auto ftype = llama_ftype(o.type)) w.add_u32("general.file_type", *ftype);  // none for TQ2_G128
    if (o.type != GgmlType::F16) w.add_u32("general.quantization_version", 2);  // as llama-quantize
    w.add_u32(a + ".vocab_size", uint32_t(s.n_vocab));
    w.add_u32(a + ".context_length", uint32_t(s.n_ctx));
    w.add_u32(a + ".embedding_length", uint32_t(s.n_embd));
    w.add_u32(a + ".block_count", uint32_t(s.n_layer));
    w.add_u32(a + ".feed_forward_length", uint32_t(s.n_ff));
    w.add_u32(a + ".attention.head_count", uint32_t(s.n_head));
    w.add_u32(a + ".attention.head_count_kv", uint32_t(s.n_head_kv));
    w.add_u32(a + ".rope.dimension_count", uint32_t(head_dim));
    w.add_f32(a + ".rope.freq_base", s.rope_theta);
    w.add_f32(a + ".attention.layer_norm_rms_epsilon", s.rms_eps);

    const SynthVocab v = make_vocab(s);
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string("tokenizer.ggml.pre", std::string(s.pre));
    w.add_array("tokenizer.ggml.tokens", v.tokens);
    w.add_array("tokenizer.ggml.token_type", v.types);
    w.add_array("tokenizer.ggml.merges", v.merges);
    w.add_u32("tokenizer.ggml.bos_token_id", uint32_t(s.bos));
    w.add_u32("tokenizer.ggml.eos_token_id", uint32_t(s.eos));
    w.add_bool("tokenizer.ggml.add_bos_token", s.add_bos);

    // Matrices have ne = [cols (fan-in), rows]; elements N(0, 1/cols) keep an input of RMS 1 at
    // RMS 1 after the product.
    auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
        w.add_tensor(name, {cols, rows}, o.type);
        init_.push_back({float(1.0 / std::sqrt(double(cols)))});
    };
    auto vector = [&](const std::string& name, int64_t n, float stddev) {
        w.add_tensor(name, {n}, GgmlType::F32);
        init_.push_back({stddev});
    };
    w.add_tensor("token_embd.weight", {s.n_embd, s.n_vocab}, o.type);
    init_.push_back({s.tied_embeddings ? float(1.0 / std::sqrt(double(s.n_embd))) : 1.0f});
    vector("output_norm.weight", s.n_embd, 0.0f);
    if (!s.tied_embeddings) matrix("output.weight", s.n_vocab, s.n_embd);
    for (int64_t il = 0; il < s.n_layer; ++il) {
        const std::string b = fmt::format("blk.{}.", il);
        vector(b + "attn_norm.weight", s.n_embd, 0.0f);
        matrix(b + "attn_q.weight", q_dim, s.n_embd);
        matrix(b + "attn_k.weight", kv_dim, s.n_embd);
        matrix(b + "attn_v.weight", kv_dim, s.n_embd);
        if (s.qkv_bias) {
            vector(b + "attn_q.bias", q_dim, 0.1f);
            vector(b + "attn_k.bias", kv_dim, 0.1f);
            vector(b + "attn_v.bias", kv_dim, 0.1f);
        }
        matrix(b + "attn_output.weight", s.n_embd, q_dim);
        vector(b + "ffn_norm.weight", s.n_embd, 0.0f);
        matrix(b + "ffn_gate.weight", s.n_ff, s.n_embd);
        matrix(b + "ffn_up.weight", s.n_ff, s.n_embd);
        matrix(b + "ffn_down.weight", s.n_embd, s.n_ff);
    }
}

void SynthModel::write(const std::string& path, const GgufStreamWriter::Progress& progress) const {
    const int threads = opts_.threads > 0 ? opts_.threads : int(std::max(1u, std::thread::hardware_concurrency()));
    ThreadPool pool(threads);
    const auto& tensors = file_.tensors();
    std::vector<uint64_t> name_hash;
    for (const GgufTensorInfo& t : tensors) name_hash.push_back(fnv1a(t.name));

    file_.write(
        path,
        [&](size_t ti, int64_t row0, int64_t n_rows, std::span<uint8_t> out) {
            const GgufTensorInfo& t = tensors[ti];
            const int64_t n = t.ne[0];
            const size_t row_bytes = ggml_row_bytes(t.type, n);
            const float stddev = init_[ti].stddev;
            pool.parallel_for(n_rows, [&](int64_t r0, int64_t r1) {
                std::vector<float> x(size_t(n), 1.0f);
                for (int64_t r = r0; r < r1; ++r) {
                    if (stddev > 0.0f) normal_row(opts_.seed, name_hash[ti], row0 + r, stddev, x.data(), n);
                    uint8_t* dst = out.data() + size_t(r) * row_bytes;
                    if (t.type == GgmlType::TQ2_0 || t.type == GgmlType::TQ2_G128) {
                        // BitNet's absmean rule with the tensor's mean |x| of N(0, stddev^2):
                        // stddev sqrt(2 / pi), so that rows are written independently.
                        quantize_row_ternary(t.type, TernaryRule::Absmean, stddev * std::sqrt(2.0 / std::numbers::pi), x.data(), n, dst);
                    } else {
                        quantize_row_ref(t.type, x.data(), n, dst);
                    }
                }
            });
        },
        progress);
}

}  // namespace vxq
