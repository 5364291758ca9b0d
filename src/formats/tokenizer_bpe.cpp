// Byte-level BPE ("gpt2"), as llama.cpp's llm_tokenizer_bpe: split the text with the regex
// pre-tokenizer named by tokenizer.ggml.pre, spell each piece's bytes in GPT-2's byte alphabet,
// then merge adjacent symbols by merge rank (lowest first) within each piece.
#include <pcre2.h>

#include <algorithm>
#include <memory>
#include <queue>
#include <unordered_map>

#include "core/error.h"
#include "formats/tokenizer.h"
#include "formats/unicode.h"

namespace vxq {
namespace {

// The pre-tokenizer regexes of llama.cpp's llm_tokenizer_bpe (llama-vocab.cpp). A pre-tokenizer
// is a list: each regex splits every piece produced by the previous ones, and the text between
// matches is kept as pieces too.
constexpr const char* kGpt2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
// Llama-3's (?i:'s|'t|...) spelled out case by case, as llama.cpp writes it.
constexpr const char* kLlama3 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// Qwen2: as Llama-3 but one digit per piece.
constexpr const char* kQwen2 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

struct PreTokenizer {
    std::vector<const char*> regexes;
    bool llama3_family = false;  // llama.cpp: add_bos = true, ignore_merges = true
};

bool lookup_pre(const std::string& pre, PreTokenizer& out) {
    if (pre == "default" || pre.empty()) {
        // llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEFAULT: punctuation runs first, then GPT-2's split,
        // then digit runs, then groups of three ASCII digits.
        out = {{"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2, "\\p{N}+", "[0-9][0-9][0-9]"}, false};
        return true;
    }
    if (pre == "gpt-2" || pre == "phi-2" || pre == "roberta-bpe" || pre == "mpt" || pre == "olmo") {
        out = {{kGpt2}, false};
        return true;
    }
    if (pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe" || pre == "falcon3") {
        out = {{kLlama3}, true};
        return true;
    }
    if (pre == "qwen2" || pre == "megrez") {
        out = {{kQwen2}, false};
        return true;
    }
    return false;
}

PreTokenizer find_pre(const std::string& pre) {
    PreTokenizer p;
    if (!lookup_pre(pre, p)) {
        fail("tokenizer: unsupported pre-tokenizer tokenizer.ggml.pre = \"{}\" (supported: default, "
             "gpt-2, llama3/llama-bpe, qwen2)",
             pre);
    }
    return p;
}

class Regex {
public:
    explicit Regex(const char* pattern) {
        int err = 0;
        PCRE2_SIZE at = 0;
        code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                              PCRE2_UTF | PCRE2_UCP, &err, &at, nullptr);
        if (!code_) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            fail("tokenizer: cannot compile pre-tokenizer regex /{}/ at offset {}: {}", pattern, at,
                 reinterpret_cast<const char*>(msg));
        }
        pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // optional speed-up; the interpreter is the fallback
    }
    ~Regex() { pcre2_code_free(code_); }
    Regex(const Regex&) = delete;
    Regex& operator=(const Regex&) = delete;

    // Appends to `out` the pieces of text[start, start + len): each match, and each gap between
    // matches. The subject is the piece alone, so a lookahead sees the piece's end as the end.
    void split(std::string_view text, size_t start, size_t len, pcre2_match_data* md,
               std::vector<std::pair<size_t, size_t>>& out) const {
        const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + start);
        size_t pos = 0, emitted = 0;
        while (pos < len) {
            const int rc = pcre2_match(code_, subject, len, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
                PCRE2_UCHAR msg[256];
                pcre2_get_error_message(rc, msg, sizeof msg);
                fail("tokenizer: pre-tokenizer regex failed: {}", reinterpret_cast<const char*>(msg));
            }
            const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
            const size_t m0 = ov[0], m1 = ov[1];
            if (m1 == m0) {  // none of these patterns matches empty; step over a character anyway
                pos = m0 + utf8::seq_len(uint8_t(text[start + m0]));
                continue;
            }
            if (m0 > emitted) out.emplace_back(start + emitted, m0 - emitted);
            out.emplace_back(start + m0, m1 - m0);
            emitted = pos = m1;
        }
        if (emitted < len) out.emplace_back(start + emitted, len - emitted);
    }

    pcre2_code* code() const { return code_; }

private:
    pcre2_code* code_ = nullptr;
};

using Regexes = std::vector<std::unique_ptr<Regex>>;

// Byte ranges [start, start + len) of text, after every regex of the pre-tokenizer has split them.
std::vector<std::pair<size_t, size_t>> pre_tokenize(const Regexes& regexes, std::string_view text,
                                                    pcre2_match_data* md) {
    std::vector<std::pair<size_t, size_t>> pieces{{0, text.size()}}, next;
    if (text.empty()) return {};
    for (const auto& re : regexes) {
        next.clear();
        for (const auto& [start, len] : pieces) re->split(text, start, len, md, next);
        pieces.swap(next);
    }
    return pieces;
}

// pcre2_match_data for one encode call (encode is const and may run on several threads).
struct MatchData {
    pcre2_match_data* md = pcre2_match_data_create(8, nullptr);
    MatchData() {
        if (!md) fail("tokenizer: out of memory for PCRE2 match data");
    }
    ~MatchData() { pcre2_match_data_free(md); }
    MatchData(const MatchData&) = delete;
    MatchData& operator=(const MatchData&) = delete;
};

class BpeTokenizer final : public Tokenizer {
public:
    BpeTokenizer(Vocab v, const PreTokenizer& pre) : Tokenizer(std::move(v)) {
        ignore_merges_ = pre.llama3_family;
        for (const char* r : pre.regexes) regexes_.push_back(std::make_unique<Regex>(r));
        // "left right" -> rank. llama.cpp splits at the first space after the first character and
        // keeps the first rank of a repeated pair; the key here is the merge line itself.
        ranks_.reserve(vocab_.merges.size());
        for (size_t i = 0; i < vocab_.merges.size(); ++i) {
            const std::string& m = vocab_.merges[i];
            if (m.find(' ', 1) == std::string::npos) continue;  // can never match a pair
            ranks_.emplace(m, int(i));
        }
        make_pieces([&](TokenId id) { return make_piece(id); });
    }

private:
    void encode_text(std::string_view text, bool parse_special, std::vector<TokenId>& out) const override {
        MatchData md;
        for (const Fragment& f : split_special(text, parse_special)) {
            if (f.token >= 0) {
                out.push_back(f.token);
            } else {
                tokenize_run(text.substr(f.offset, f.length), md.md, out);
            }
        }
    }

    struct Symbol {
        int prev, next;
        size_t start, n;  // bytes of the encoded word; n == 0 once merged into its left neighbour
    };
    struct Bigram {
        int left, right;
        std::string text;
        int rank;
    };
    // Lowest rank first; equal ranks: leftmost first.
    struct Order {
        bool operator()(const Bigram& l, const Bigram& r) const {
            return l.rank > r.rank || (l.rank == r.rank && l.left > r.left);
        }
    };

    void tokenize_run(std::string_view text, pcre2_match_data* md, std::vector<TokenId>& out) const {
        const auto pieces = pre_tokenize(regexes_, text, md);
        std::string word;
        for (const auto& [start, len] : pieces) {
            word.clear();
            for (size_t i = start; i < start + len; ++i) word += byte_unicode::encode_byte(uint8_t(text[i]));
            merge_word(word, out);
        }
    }

    void merge_word(const std::string& word, std::vector<TokenId>& out) const {
        std::vector<Symbol> symbols;
        if (ignore_merges_ && find_token(word) >= 0) {
            symbols.push_back({-1, -1, 0, word.size()});
        } else {
            for (size_t off = 0; off < word.size();) {
                const size_t n = std::min(utf8::seq_len(uint8_t(word[off])), word.size() - off);
                const int idx = int(symbols.size());
                symbols.push_back({idx - 1, off + n == word.size() ? -1 : idx + 1, off, n});
                off += n;
            }
        }
        const auto sym_text = [&](const Symbol& s) { return word.substr(s.start, s.n); };

        std::priority_queue<Bigram, std::vector<Bigram>, Order> queue;
        const auto add_bigram = [&](int left, int right) {
            if (left == -1 || right == -1) return;
            const std::string l = sym_text(symbols[size_t(left)]);
            const std::string r = sym_text(symbols[size_t(right)]);
            const auto it = ranks_.find(l + ' ' + r);
            if (it == ranks_.end()) return;
            queue.push({left, right, l + r, it->second});
        };
        for (int i = 1; i < int(symbols.size()); ++i) add_bigram(i - 1, i);

        while (!queue.empty()) {
            const Bigram b = queue.top();
            queue.pop();
            Symbol& left = symbols[size_t(b.left)];
            Symbol& right = symbols[size_t(b.right)];
            if (left.n == 0 || right.n == 0) continue;
            if (sym_text(left) + sym_text(right) != b.text) continue;  // stale entry
            left.n += right.n;
            right.n = 0;
            left.next = right.next;
            if (right.next >= 0) symbols[size_t(right.next)].prev = b.left;
            add_bigram(left.prev, b.left);
            add_bigram(b.left, left.next);
        }

        for (const Symbol& s : symbols) {
            if (s.n == 0) continue;
            const std::string t = sym_text(s);
            const TokenId id = find_token(t);
            if (id >= 0) {
                out.push_back(id);
                continue;
            }
            // As llama.cpp: try each byte of the spelling as a one-byte token, drop it otherwise.
            for (char c : t) {
                const TokenId b = find_token(std::string(1, c));
                if (b >= 0) out.push_back(b);
            }
        }
    }

    // llama_token_to_piece(special = false) for BPE: normal tokens are spelled in the byte
    // alphabet and map back to bytes; user-defined tokens are literal text.
    std::string make_piece(TokenId id) const {
        const std::string& text = vocab_.tokens[size_t(id)];
        switch (type_of(id)) {
            case TokenType::Normal: {
                std::string s;
                for (size_t pos = 0; pos < text.size();) {
                    const size_t at = pos;
                    const int b = byte_unicode::decode_cp(utf8::decode(text, pos));
                    if (b >= 0) {
                        s.push_back(char(b));
                    } else {
                        // llama.cpp's llama_decode_text marker for a char outside the alphabet.
                        s += "[UNK_BYTE_0x";
                        for (size_t k = at; k < pos; ++k) s += fmt::format("{:02x}", unsigned(uint8_t(text[k])));
                        s += text + "]";
                    }
                }
                return s;
            }
            case TokenType::UserDefined:
                return text;
            default:  // control, unknown, byte, unused, undefined
                return {};
        }
    }

    Regexes regexes_;
    std::unordered_map<std::string, int> ranks_;
    bool ignore_merges_ = false;
};

}  // namespace

namespace detail {

bool bpe_pre_is_llama3(const std::string& pre) {
    PreTokenizer p;
    return lookup_pre(pre, p) && p.llama3_family;
}

std::unique_ptr<Tokenizer> make_bpe_tokenizer(Vocab v) {
    const PreTokenizer pre = find_pre(v.pre);
    return std::make_unique<BpeTokenizer>(std::move(v), pre);
}

std::vector<std::string> bpe_pre_tokenize(const std::string& pre, std::string_view text) {
    if (const int64_t bad = find_invalid_utf8(text); bad >= 0) {
        fail("tokenizer: input is not valid UTF-8 at byte offset {}", bad);
    }
    Regexes regexes;
    for (const char* r : find_pre(pre).regexes) regexes.push_back(std::make_unique<Regex>(r));
    MatchData md;
    std::vector<std::string> out;
    for (const auto& [start, len] : pre_tokenize(regexes, text, md.md)) out.emplace_back(text.substr(start, len));
    return out;
}

}  // namespace detail
}  // namespace vxq
