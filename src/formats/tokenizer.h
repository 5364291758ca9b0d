// Tokenizers described by GGUF metadata (tokenizer.ggml.*), faithful to llama.cpp:
//  - "llama": SentencePiece-style, score-driven bigram merges over UTF-8 characters, space
//    prefix and U+2581 for spaces, byte fallback to <0xXX> tokens;
//  - "gpt2": byte-level BPE with merge ranks, after a regex pre-tokenizer selected by
//    tokenizer.ggml.pre ("default"/"gpt-2", "llama3"/"llama-bpe", "qwen2"), run with PCRE2.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace vxq {

class GgufFile;

using TokenId = int32_t;

enum class TokenType : int32_t {
    Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6,
};

struct Vocab {
    std::string model;                 // tokenizer.ggml.model: "llama" or "gpt2"
    std::string pre = "default";       // tokenizer.ggml.pre
    std::vector<std::string> tokens;
    std::vector<float> scores;         // may be empty for gpt2
    std::vector<TokenType> types;      // may be empty: all Normal
    std::vector<std::string> merges;   // gpt2 only: "left right"
    TokenId bos = -1, eos = -1, eot = -1, unk = -1, pad = -1;
    bool add_bos = true;               // llama default true, gpt2 default false
    bool add_eos = false;
    bool add_space_prefix = true;      // llama only

    // Reads and validates tokenizer.ggml.* (array lengths agree, ids in range).
    static Vocab from_gguf(const GgufFile& f);
};

class Tokenizer {
public:
    virtual ~Tokenizer() = default;

    // Builds the tokenizer for vocab.model; vxq::Error for an unknown model or pre-tokenizer.
    static std::unique_ptr<Tokenizer> create(Vocab vocab);

    // Text to ids. add_special: prepend BOS / append EOS as the vocab says. parse_special:
    // control/user-defined token texts (e.g. "<s>") in the text become those tokens.
    // vxq::Error if text is not valid UTF-8 (naming the byte offset).
    std::vector<TokenId> encode(std::string_view text, bool add_special, bool parse_special = false) const;

    // The bytes one token contributes to output, as llama.cpp's token_to_piece with
    // special=false: control tokens give "", byte tokens give their byte (possibly a partial
    // UTF-8 sequence), U+2581 becomes a space (llama), byte-level chars are unmapped (gpt2).
    // vxq::Error for an id outside the vocabulary.
    std::string token_to_piece(TokenId id) const;

    // Concatenated pieces.
    std::string decode(std::span<const TokenId> ids) const;

    const Vocab& vocab() const { return vocab_; }
    int32_t n_vocab() const { return int32_t(vocab_.tokens.size()); }
    // End of generation: EOS or EOT.
    bool is_eog(TokenId id) const { return id >= 0 && (id == vocab_.eos || id == vocab_.eot); }

protected:
    // Validates the vocab (array lengths, special ids), names empty tokens "[EMPTY_<id>]" as
    // llama.cpp does, and builds the text -> id map and the special-token list.
    explicit Tokenizer(Vocab v);

    TokenType type_of(TokenId id) const {
        return vocab_.types.empty() ? TokenType::Normal : vocab_.types[size_t(id)];
    }
    // Id of the token spelled exactly `text`, or -1.
    TokenId find_token(const std::string& text) const {
        auto it = token_to_id_.find(text);
        return it == token_to_id_.end() ? -1 : it->second;
    }

    // A piece of the input after special tokens were split out: a special token (token >= 0) or
    // a run of raw text [offset, offset + length).
    struct Fragment {
        TokenId token;
        size_t offset, length;
    };
    // llama.cpp's tokenizer_st_partition: user-defined tokens are always split out, control and
    // unknown tokens only when parse_special; longer token texts first.
    std::vector<Fragment> split_special(std::string_view text, bool parse_special) const;
    // vxq::Error naming the offset if text is not valid UTF-8.
    static void check_utf8(std::string_view text);

    // The model's own part of encode: the ids of valid UTF-8 text, between BOS and EOS.
    virtual void encode_text(std::string_view text, bool parse_special, std::vector<TokenId>& out) const = 0;
    // Each token's piece (token_to_piece), computed once by the model's constructor: piece(id).
    template <class Piece>
    void make_pieces(Piece piece) {
        pieces_.resize(vocab_.tokens.size());
        for (size_t i = 0; i < pieces_.size(); ++i) pieces_[i] = piece(TokenId(i));
    }

    Vocab vocab_;
    std::unordered_map<std::string, TokenId> token_to_id_;
    std::vector<TokenId> special_tokens_;  // control / user-defined / unknown, longest text first

private:
    std::vector<std::string> pieces_;  // [n_vocab]
};

namespace detail {
// The pieces (raw bytes) the BPE pre-tokenizer named `pre` cuts `text` into, before byte-level
// BPE runs on each; vxq::Error for an unknown pre-tokenizer. For tests and debugging.
std::vector<std::string> bpe_pre_tokenize(const std::string& pre, std::string_view text);
}  // namespace detail

// Validates UTF-8 (no overlongs, no surrogates, <= U+10FFFF). Returns the offset of the first
// bad byte (for a truncated or otherwise ill-formed sequence, the offset of its lead byte), or -1
// when valid.
int64_t find_invalid_utf8(std::string_view s);

// Streams token pieces to text, holding back an incomplete UTF-8 sequence at the end until the
// bytes that finish it arrive, so a byte-fallback character split over tokens prints once, whole.
class Utf8Stream {
public:
    std::string push(std::string_view piece);
    std::string finish();  // whatever is held back (an unfinished sequence at end of output)
private:
    std::string pending_;
};

}  // namespace vxq
