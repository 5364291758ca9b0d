#include "support/tiny_model.h"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <stdexcept>
#include <utility>

#include "core/splitmix.h"
#include "support/gguf_writer.h"

namespace vxq::test {

namespace {

// ---- seeded random numbers: splitmix64, one stream per tensor (seed, name) ----

uint64_t fnv1a(const std::string& s) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
    return h;
}

// n values, uniform in [center - half_width, center + half_width).
std::vector<float> uniform(uint64_t seed, const std::string& name, size_t n, float center, float half_width) {
    uint64_t s = seed * 0x2545F4914F6CDD1Dull ^ fnv1a(name);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) {
        const double u = double(splitmix64(s) >> 11) * 0x1p-53;  // [0, 1)
        v[i] = float(double(center) + double(half_width) * (2.0 * u - 1.0));
    }
    return v;
}

// Uniform with standard deviation `std`: half width std * sqrt(3).
std::vector<float> random_std(uint64_t seed, const std::string& name, size_t n, double std) {
    return uniform(seed, name, n, 0.0f, float(std * std::sqrt(3.0)));
}

// ---- tokenizers ----

std::string utf8(uint32_t cp) {
    std::string s;
    if (cp < 0x80) {
        s += char(cp);
    } else if (cp < 0x800) {
        s += char(0xC0 | (cp >> 6));
        s += char(0x80 | (cp & 0x3F));
    } else {
        s += char(0xE0 | (cp >> 12));
        s += char(0x80 | ((cp >> 6) & 0x3F));
        s += char(0x80 | (cp & 0x3F));
    }
    return s;
}

// Splits UTF-8 text into its characters (well-formed input only).
std::vector<std::string> utf8_chars(const std::string& s) {
    std::vector<std::string> out;
    for (size_t i = 0; i < s.size();) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        const size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        out.push_back(s.substr(i, len));
        i += len;
    }
    return out;
}

constexpr int32_t kNormal = 1, kUnknown = 2, kControl = 3, kByte = 6;

struct TokVocab {
    std::vector<std::string> tokens;
    std::vector<float> scores;
    std::vector<int32_t> types;
    std::vector<std::string> merges;
};

// Byte-level BPE ("gpt2") vocabulary: the 256 byte characters of GPT-2's byte-to-unicode map,
// merges that build a few words, reserved control tokens as padding, and Qwen's three specials
// last. Exactly n_vocab tokens.
TokVocab gpt2_vocab(int64_t n_vocab) {
    TokVocab v;
    std::vector<std::string> byte_char(256);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
        const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        byte_char[size_t(b)] = utf8(printable ? uint32_t(b) : next++);
    }
    v.tokens = byte_char;
    const std::string sp = utf8(0x120);  // 'Ġ', the byte-level space
    const char* const words[] = {"the", "and", "hello", "world", "model", "of", "to", "in", "is", "quant"};
    std::vector<std::string> pieces;
    for (const char* w : words) pieces.push_back(sp + w);
    pieces.push_back("ing");
    pieces.push_back("er");
    const size_t n_special = 3;
    const size_t room = size_t(n_vocab) - 256 - n_special;
    std::set<std::string> have(v.tokens.begin(), v.tokens.end());
    for (const std::string& p : pieces) {
        const std::vector<std::string> ch = utf8_chars(p);
        std::string left = ch[0];
        for (size_t i = 1; i < ch.size() && v.tokens.size() - 256 < room; ++i) {
            const std::string merged = left + ch[i];
            if (!have.count(merged)) {
                v.merges.push_back(left + " " + ch[i]);
                v.tokens.push_back(merged);
                have.insert(merged);
            }
            left = merged;
        }
    }
    v.types.assign(v.tokens.size(), kNormal);
    for (int i = 0; v.tokens.size() < size_t(n_vocab) - n_special; ++i) {
        v.tokens.push_back("<|reserved_" + std::to_string(i) + "|>");
        v.types.push_back(kControl);
    }
    for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
        v.tokens.push_back(s);
        v.types.push_back(kControl);
    }
    return v;
}

// SentencePiece ("llama") vocabulary: <unk> <s> </s>, the 256 <0xXX> byte tokens, "▁", letters
// and a few words with descending scores, padded with "▁tokN". Exactly n_vocab tokens.
TokVocab spm_vocab(int64_t n_vocab) {
    TokVocab v;
    auto add = [&](const std::string& t, float score, int32_t type) {
        v.tokens.push_back(t);
        v.scores.push_back(score);
        v.types.push_back(type);
    };
    add("<unk>", 0.0f, kUnknown);
    add("<s>", 0.0f, kControl);
    add("</s>", 0.0f, kControl);
    static const char* const hex = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) add(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">", 0.0f, kByte);
    const std::string sp = utf8(0x2581);  // '▁'
    std::vector<std::string> pieces = {sp};
    for (char c = 'a'; c <= 'z'; ++c) pieces.push_back(std::string(1, c));
    for (const char* w : {"the", "and", "hello", "world", "model", "quant"}) pieces.push_back(sp + w);
    for (const char* w : {"he", "ll", "lo", "or", "ld", "in", "er"}) pieces.push_back(w);
    float score = -1.0f;
    for (const std::string& p : pieces) {
        if (v.tokens.size() >= size_t(n_vocab)) break;
        add(p, score, kNormal);
        score -= 1.0f;
    }
    for (int i = 0; v.tokens.size() < size_t(n_vocab); ++i) {
        add(sp + "tok" + std::to_string(i), score, kNormal);
        score -= 1.0f;
    }
    return v;
}

std::string temp_path() {
    static std::atomic<int> counter{0};
    const std::string name = "vxq_tiny_model_" + std::to_string(::getpid()) + "_" +
                             std::to_string(counter.fetch_add(1)) + ".gguf";
    return (std::filesystem::temp_directory_path() / name).string();
}

float round_to_f16(float x) { return float(static_cast<_Float16>(x)); }

}  // namespace

TinyModel::TinyModel(TinyModel&& o) noexcept { *this = std::move(o); }

TinyModel& TinyModel::operator=(TinyModel&& o) noexcept {
    if (this != &o) {
        if (!path.empty()) {
            std::error_code ec;
            std::filesystem::remove(path, ec);
        }
        path = std::exchange(o.path, std::string());
        spec = std::move(o.spec);
        token_embd = std::move(o.token_embd);
        output = std::move(o.output);
        output_norm = std::move(o.output_norm);
        layers = std::move(o.layers);
    }
    return *this;
}

TinyModel::~TinyModel() {
    if (!path.empty()) {
        std::error_code ec;
        std::filesystem::remove(path, ec);
    }
}

TinyModel build_tiny_model(const TinyModelSpec& spec_in, const std::string& path_in) {
    TinyModelSpec s = spec_in;
    if (s.arch != "llama" && s.arch != "qwen2" && s.arch != "qwen3") {
        throw std::invalid_argument("build_tiny_model: arch must be llama, qwen2 or qwen3");
    }
    if (s.n_vocab < 260) throw std::invalid_argument("build_tiny_model: n_vocab must be >= 260");
    if (s.weight_type != GgmlType::F32 && s.weight_type != GgmlType::F16) {
        throw std::invalid_argument("build_tiny_model: weight_type must be F32 or F16");
    }
    const int64_t default_head_dim = s.n_embd / s.n_head;
    if (s.head_dim == 0) s.head_dim = default_head_dim;
    if (s.n_rot == 0) s.n_rot = s.head_dim;
    if (s.meta_arch.empty()) s.meta_arch = s.arch;
    const bool qkv_bias = s.qkv_bias.value_or(s.arch == "qwen2");
    const bool qk_norm = s.qk_norm.value_or(s.arch == "qwen3");
    const bool write_key_length = s.write_key_length || s.head_dim != default_head_dim;

    TinyModel m;
    m.spec = s;
    const int64_t q_dim = m.q_dim(), kv_dim = m.kv_dim();

    GgufWriter w;
    const std::string p = s.meta_arch + ".";
    w.add_string("general.architecture", s.meta_arch);
    w.add_string("general.name", "tiny-" + s.arch);
    w.add_u32(p + "context_length", uint32_t(s.n_ctx_train));
    w.add_u32(p + "embedding_length", uint32_t(s.n_embd));
    w.add_u32(p + "block_count", uint32_t(s.meta_n_layer.value_or(s.n_layer)));
    w.add_u32(p + "feed_forward_length", uint32_t(s.n_ff));
    w.add_u32(p + "attention.head_count", uint32_t(s.n_head));
    w.add_u32(p + "attention.head_count_kv", uint32_t(s.n_head_kv));
    if (write_key_length) {
        w.add_u32(p + "attention.key_length", uint32_t(s.head_dim));
        w.add_u32(p + "attention.value_length", uint32_t(s.head_dim));
    }
    w.add_u32(p + "rope.dimension_count", uint32_t(s.n_rot));
    w.add_f32(p + "rope.freq_base", s.rope_base);
    w.add_f32(p + "attention.layer_norm_rms_epsilon", s.rms_eps);

    const bool bpe = s.arch != "llama";
    const TokVocab tv = bpe ? gpt2_vocab(s.n_vocab) : spm_vocab(s.n_vocab);
    w.add_string("tokenizer.ggml.model", bpe ? "gpt2" : "llama");
    if (bpe) w.add_string("tokenizer.ggml.pre", "qwen2");
    w.add_array("tokenizer.ggml.tokens", tv.tokens);
    if (!tv.scores.empty()) w.add_array("tokenizer.ggml.scores", tv.scores);
    w.add_array("tokenizer.ggml.token_type", tv.types);
    if (bpe) {
        w.add_array("tokenizer.ggml.merges", tv.merges);
        const uint32_t eot = uint32_t(s.n_vocab - 3);  // <|endoftext|>
        w.add_u32("tokenizer.ggml.bos_token_id", eot);
        w.add_u32("tokenizer.ggml.eos_token_id", eot);
    } else {
        w.add_u32("tokenizer.ggml.unknown_token_id", 0);
        w.add_u32("tokenizer.ggml.bos_token_id", 1);
        w.add_u32("tokenizer.ggml.eos_token_id", 2);
    }

    // Each tensor: random values, written (unless dropped) with its dims or the override, and
    // returned as the values the file holds.
    auto tensor = [&](const std::string& name, std::vector<int64_t> ne, bool matrix, auto gen) {
        if (auto it = s.reshape.find(name); it != s.reshape.end()) ne = it->second;
        size_t n = 1;
        for (int64_t d : ne) n *= size_t(d);
        std::vector<float> v = gen(name, n);
        const GgmlType t = matrix ? s.weight_type : GgmlType::F32;
        if (t == GgmlType::F16) {
            for (float& x : v) x = round_to_f16(x);
        }
        if (!s.drop_tensors.count(name)) w.add_tensor_from_f32(name, ne, t, v);
        return v;
    };
    // A matrix of `rows` outputs and `cols` inputs, elements of std gain / sqrt(cols): maps
    // inputs of RMS 1 to outputs of RMS ~gain.
    auto mat = [&](const std::string& name, int64_t rows, int64_t cols, double gain) {
        return tensor(name, {cols, rows}, true, [&](const std::string& nm, size_t n) {
            return random_std(s.seed, nm, n, gain / std::sqrt(double(cols)));
        });
    };
    auto vec = [&](const std::string& name, int64_t n_el, float center, float half_width) {
        return tensor(name, {n_el}, false, [&](const std::string& nm, size_t n) {
            return uniform(s.seed, nm, n, center, half_width);
        });
    };

    // Embeddings of RMS 0.5; the head gives logits of std ~3 (tied: ~0.5 * sqrt(n_embd) = 4).
    m.token_embd = tensor("token_embd.weight", {s.n_embd, s.n_vocab}, true, [&](const std::string& nm, size_t n) {
        return random_std(s.seed, nm, n, 0.5);
    });
    m.output_norm = vec("output_norm.weight", s.n_embd, 1.0f, 0.2f);
    m.output = s.tied_output ? m.token_embd : mat("output.weight", s.n_vocab, s.n_embd, 3.0);

    for (int64_t il = 0; il < s.n_layer; ++il) {
        const std::string b = "blk." + std::to_string(il) + ".";
        TinyLayer L;
        L.attn_norm = vec(b + "attn_norm.weight", s.n_embd, 1.0f, 0.2f);
        L.wq = mat(b + "attn_q.weight", q_dim, s.n_embd, 1.0);
        L.wk = mat(b + "attn_k.weight", kv_dim, s.n_embd, 1.0);
        L.wv = mat(b + "attn_v.weight", kv_dim, s.n_embd, 1.0);
        if (qkv_bias) {  // qwen2's biases are large on purpose: dropping them must show
            L.bq = vec(b + "attn_q.bias", q_dim, 0.0f, 1.0f);
            L.bk = vec(b + "attn_k.bias", kv_dim, 0.0f, 1.0f);
            L.bv = vec(b + "attn_v.bias", kv_dim, 0.0f, 0.5f);
        }
        L.wo = mat(b + "attn_output.weight", s.n_embd, q_dim, 0.7);
        if (qk_norm) {
            L.q_norm = vec(b + "attn_q_norm.weight", s.head_dim, 1.0f, 0.5f);
            L.k_norm = vec(b + "attn_k_norm.weight", s.head_dim, 1.0f, 0.5f);
        }
        L.ffn_norm = vec(b + "ffn_norm.weight", s.n_embd, 1.0f, 0.2f);
        L.w_gate = mat(b + "ffn_gate.weight", s.n_ff, s.n_embd, 1.0);
        L.w_up = mat(b + "ffn_up.weight", s.n_ff, s.n_embd, 1.0);
        L.w_down = mat(b + "ffn_down.weight", s.n_embd, s.n_ff, 0.7);
        m.layers.push_back(std::move(L));
    }
    for (const std::string& name : s.extra_tensors) vec(name, s.n_embd, 1.0f, 0.2f);

    const std::string path = path_in.empty() ? temp_path() : path_in;
    w.write(path);
    m.path = path;
    return m;
}

}  // namespace vxq::test
