// Vocab loading and validation, the parts shared by both tokenizers (special-token splitting,
// UTF-8 checking, decode), and the factory. The algorithms live in tokenizer_spm.cpp and
// tokenizer_bpe.cpp.
#include "formats/tokenizer.h"

#include <algorithm>

#include "core/error.h"
#include "formats/gguf.h"

namespace vxq {

namespace detail {
// Defined in tokenizer_spm.cpp / tokenizer_bpe.cpp.
std::unique_ptr<Tokenizer> make_spm_tokenizer(Vocab v);
std::unique_ptr<Tokenizer> make_bpe_tokenizer(Vocab v);
// Pre-tokenizer names tokenizer_bpe.cpp knows; true for the Llama-3 family, which llama.cpp gives
// add_bos = true and ignore_merges = true.
bool bpe_pre_is_llama3(const std::string& pre);
}  // namespace detail

namespace {

constexpr const char* kModel = "tokenizer.ggml.model";
constexpr const char* kPre = "tokenizer.ggml.pre";
constexpr const char* kTokens = "tokenizer.ggml.tokens";
constexpr const char* kScores = "tokenizer.ggml.scores";
constexpr const char* kTypes = "tokenizer.ggml.token_type";
constexpr const char* kMerges = "tokenizer.ggml.merges";

bool is_int_type(GgufValueType t) {
    switch (t) {
        case GgufValueType::UINT8: case GgufValueType::INT8: case GgufValueType::UINT16:
        case GgufValueType::INT16: case GgufValueType::UINT32: case GgufValueType::INT32:
        case GgufValueType::UINT64: case GgufValueType::INT64:
            return true;
        default:
            return false;
    }
}

const GgufValue* get_typed_array(const GgufFile& f, const char* key, bool (*elem_ok)(GgufValueType),
                                 const char* what) {
    const GgufValue* v = f.get_array(key);
    if (!v) return nullptr;
    if (!elem_ok(v->elem_type)) {
        fail("{}: {}: expected an array of {}, found an array of {}", f.path(), key, what,
             gguf_value_type_name(v->elem_type));
    }
    return v;
}

// A special token id: absent or 0xFFFFFFFF (what convert_hf_to_gguf writes for "none") -> -1.
TokenId read_token_id(const GgufFile& f, const char* key, size_t n_tokens) {
    const auto v = f.get_int(key);
    if (!v || *v == int64_t(0xFFFFFFFF) || *v == -1) return -1;
    if (*v < 0 || uint64_t(*v) >= n_tokens) {
        fail("{}: {} = {} is out of range: the vocabulary has {} tokens", f.path(), key, *v,
             n_tokens);
    }
    return TokenId(*v);
}

}  // namespace

Vocab Vocab::from_gguf(const GgufFile& f) {
    Vocab v;
    const auto model = f.get_string(kModel);
    if (!model) fail("{}: no {} (the file has no tokenizer)", f.path(), kModel);
    v.model = *model;
    if (auto pre = f.get_string(kPre); pre && !pre->empty()) v.pre = *pre;

    const GgufValue* tokens = get_typed_array(
        f, kTokens, [](GgufValueType t) { return t == GgufValueType::STRING; }, "strings");
    if (!tokens) fail("{}: no {}", f.path(), kTokens);
    v.tokens = tokens->strs;
    const size_t n = v.tokens.size();
    if (n == 0) fail("{}: {} is empty", f.path(), kTokens);
    if (n > size_t(INT32_MAX)) fail("{}: {} has {} tokens, too many", f.path(), kTokens, n);

    if (const GgufValue* s = get_typed_array(
            f, kScores,
            [](GgufValueType t) { return t == GgufValueType::FLOAT32 || t == GgufValueType::FLOAT64; },
            "floats")) {
        if (s->floats.size() != n) {
            fail("{}: {} has {} entries but {} has {}", f.path(), kScores, s->floats.size(), kTokens, n);
        }
        v.scores.assign(s->floats.begin(), s->floats.end());
    }
    if (const GgufValue* t = get_typed_array(f, kTypes, is_int_type, "integers")) {
        if (t->ints.size() != n) {
            fail("{}: {} has {} entries but {} has {}", f.path(), kTypes, t->ints.size(), kTokens, n);
        }
        v.types.reserve(n);
        for (int64_t x : t->ints) {
            // Like llama.cpp, a value outside the enum counts as "undefined" (piece "").
            v.types.push_back(x >= 0 && x <= 6 ? TokenType(x) : TokenType::Undefined);
        }
    }
    if (v.model == "gpt2") {
        const GgufValue* m = get_typed_array(
            f, kMerges, [](GgufValueType t) { return t == GgufValueType::STRING; }, "strings");
        if (!m) fail("{}: {} is \"gpt2\" but there is no {}", f.path(), kModel, kMerges);
        v.merges = m->strs;
    }

    v.bos = read_token_id(f, "tokenizer.ggml.bos_token_id", n);
    v.eos = read_token_id(f, "tokenizer.ggml.eos_token_id", n);
    v.eot = read_token_id(f, "tokenizer.ggml.eot_token_id", n);
    v.unk = read_token_id(f, "tokenizer.ggml.unknown_token_id", n);
    v.pad = read_token_id(f, "tokenizer.ggml.padding_token_id", n);

    // Defaults as llama.cpp's llama_vocab::load: SPM adds BOS and a space prefix; BPE adds
    // neither, except the Llama-3 family which adds BOS.
    if (v.model == "gpt2") {
        v.add_bos = detail::bpe_pre_is_llama3(v.pre);
        v.add_space_prefix = false;
    } else {
        v.add_bos = true;
        v.add_space_prefix = true;
    }
    v.add_eos = false;
    if (auto b = f.get_bool("tokenizer.ggml.add_bos_token")) v.add_bos = *b;
    if (auto b = f.get_bool("tokenizer.ggml.add_eos_token")) v.add_eos = *b;
    if (auto b = f.get_bool("tokenizer.ggml.add_space_prefix")) v.add_space_prefix = *b;

    // llama.cpp finds the end-of-turn token by its text when the file does not name it, and makes
    // it a control token (chat models whose converter did not write eot_token_id).
    if (v.eot < 0) {
        static const char* const kEotTexts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>",
                                                "<end_of_turn>", "<|endoftext|>", "<EOT>"};
        for (size_t id = 0; id < n && v.eot < 0; ++id) {
            for (const char* t : kEotTexts) {
                if (v.tokens[id] == t) {
                    v.eot = TokenId(id);
                    if (v.types.empty()) v.types.assign(n, TokenType::Normal);
                    v.types[id] = TokenType::Control;
                    break;
                }
            }
        }
    }
    return v;
}

Tokenizer::Tokenizer(Vocab v) : vocab_(std::move(v)) {
    const size_t n = vocab_.tokens.size();
    if (n == 0) fail("tokenizer: the vocabulary is empty");
    if (n > size_t(INT32_MAX)) fail("tokenizer: {} tokens is too many", n);
    if (!vocab_.scores.empty() && vocab_.scores.size() != n) {
        fail("tokenizer: {} scores for {} tokens ({})", vocab_.scores.size(), n, kScores);
    }
    if (!vocab_.types.empty() && vocab_.types.size() != n) {
        fail("tokenizer: {} token types for {} tokens ({})", vocab_.types.size(), n, kTypes);
    }
    const std::pair<const char*, TokenId> ids[] = {
        {"bos_token_id", vocab_.bos}, {"eos_token_id", vocab_.eos}, {"eot_token_id", vocab_.eot},
        {"unknown_token_id", vocab_.unk}, {"padding_token_id", vocab_.pad}};
    for (const auto& [name, id] : ids) {
        if (id < -1 || id >= TokenId(n)) {
            fail("tokenizer: tokenizer.ggml.{} = {} is out of range: the vocabulary has {} tokens",
                 name, id, n);
        }
    }

    token_to_id_.reserve(n);
    for (size_t i = 0; i < n; ++i) {
        std::string& text = vocab_.tokens[i];
        if (text.empty()) text = "[EMPTY_" + std::to_string(i) + "]";  // as llama.cpp
        auto [it, inserted] = token_to_id_.emplace(text, TokenId(i));
        if (!inserted) {
            // llama.cpp refuses these too (an assert on the map size).
            fail("tokenizer: {}: tokens {} and {} are both \"{}\"", kTokens, it->second, i, text);
        }
        const TokenType t = type_of(TokenId(i));
        if (t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown) {
            special_tokens_.push_back(TokenId(i));
        }
    }
    std::stable_sort(special_tokens_.begin(), special_tokens_.end(), [&](TokenId a, TokenId b) {
        return vocab_.tokens[size_t(a)].size() > vocab_.tokens[size_t(b)].size();
    });
}

std::unique_ptr<Tokenizer> Tokenizer::create(Vocab vocab) {
    if (vocab.model == "llama") return detail::make_spm_tokenizer(std::move(vocab));
    if (vocab.model == "gpt2") return detail::make_bpe_tokenizer(std::move(vocab));
    fail("tokenizer: unsupported {} \"{}\" (supported: \"llama\", \"gpt2\")", kModel, vocab.model);
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
    check_utf8(text);
    std::vector<TokenId> out;
    if (add_special && vocab_.add_bos) {
        if (vocab_.bos < 0) fail("tokenizer: the vocab asks for BOS but has no BOS token");
        out.push_back(vocab_.bos);
    }
    encode_text(text, parse_special, out);
    if (add_special && vocab_.add_eos) {
        if (vocab_.eos < 0) fail("tokenizer: the vocab asks for EOS but has no EOS token");
        out.push_back(vocab_.eos);
    }
    return out;
}

std::string Tokenizer::token_to_piece(TokenId id) const {
    if (id < 0 || id >= n_vocab()) fail("tokenizer: token id {} is out of range (vocabulary of {})", id, n_vocab());
    return pieces_[size_t(id)];
}

std::string Tokenizer::decode(std::span<const TokenId> ids) const {
    std::string out;
    for (TokenId id : ids) out += token_to_piece(id);
    return out;
}

void Tokenizer::check_utf8(std::string_view text) {
    const int64_t bad = find_invalid_utf8(text);
    if (bad >= 0) {
        fail("tokenizer: input is not valid UTF-8: bad byte 0x{:02X} at byte offset {}",
             unsigned(uint8_t(text[size_t(bad)])), bad);
    }
}

std::vector<Tokenizer::Fragment> Tokenizer::split_special(std::string_view text,
                                                          bool parse_special) const {
    std::vector<Fragment> frags;
    if (text.empty()) return frags;
    frags.push_back({-1, 0, text.size()});
    std::vector<Fragment> next;
    for (TokenId id : special_tokens_) {
        const TokenType t = type_of(id);
        if (!parse_special && t != TokenType::UserDefined) continue;
        const std::string& tok = vocab_.tokens[size_t(id)];
        next.clear();
        bool changed = false;
        for (const Fragment& f : frags) {
            if (f.token >= 0) {
                next.push_back(f);
                continue;
            }
            const std::string_view raw = text.substr(f.offset, f.length);
            size_t pos = 0;
            while (pos < raw.size()) {
                const size_t hit = raw.find(tok, pos);
                if (hit == std::string_view::npos) break;
                if (hit > pos) next.push_back({-1, f.offset + pos, hit - pos});
                next.push_back({id, 0, 0});
                pos = hit + tok.size();
                changed = true;
            }
            if (pos < raw.size()) next.push_back({-1, f.offset + pos, raw.size() - pos});
        }
        if (changed) frags.swap(next);
    }
    return frags;
}

}  // namespace vxq
