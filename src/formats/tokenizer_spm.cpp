// SentencePiece-style tokenizer ("llama"), the same algorithm as llama.cpp's llm_tokenizer_spm:
// start from UTF-8 characters and keep merging the adjacent pair whose concatenation is the
// vocabulary token with the highest score; what never became a token falls back to <0xXX> bytes.
#include <algorithm>
#include <cstdlib>
#include <queue>
#include <unordered_map>

#include "core/error.h"
#include "formats/tokenizer.h"
#include "formats/unicode.h"

namespace vxq {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

void replace_all(std::string& s, std::string_view from, std::string_view to) {
    std::string out;
    out.reserve(s.size());
    size_t pos = 0;
    for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
        out.append(s, pos, hit - pos);
        out.append(to);
    }
    out.append(s, pos, std::string::npos);
    s = std::move(out);
}

class SpmTokenizer final : public Tokenizer {
public:
    explicit SpmTokenizer(Vocab v) : Tokenizer(std::move(v)) {
        make_pieces([&](TokenId id) { return make_piece(id); });
        static const char* const hex = "0123456789ABCDEF";
        for (int b = 0; b < 256; ++b) {
            const char name[7] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>', 0};
            TokenId id = find_token(name);
            if (id < 0) id = find_token(std::string(1, char(b)));  // llama.cpp's second choice
            byte_token_[b] = id >= 0 ? id : vocab_.unk;
        }
    }

private:
    void encode_text(std::string_view text, bool parse_special, std::vector<TokenId>& out) const override {
        // As llama.cpp: the space prefix goes before every run of text that starts the input or
        // follows a special token.
        bool prev_special = true;
        for (const Fragment& f : split_special(text, parse_special)) {
            if (f.token >= 0) {
                out.push_back(f.token);
                prev_special = true;
                continue;
            }
            std::string s;
            if (vocab_.add_space_prefix && prev_special) s = " ";
            s.append(text.substr(f.offset, f.length));
            replace_all(s, " ", kSpace);
            Session(*this, s).run(out);
            prev_special = false;
        }
    }

    // One run of text: symbols are byte ranges of `text`, linked into a list as pairs merge.
    class Session {
    public:
        Session(const SpmTokenizer& tok, const std::string& text) : tok_(tok), text_(text) {}

        void run(std::vector<TokenId>& out) {
            for (size_t off = 0; off < text_.size();) {
                const size_t n = std::min(utf8::seq_len(uint8_t(text_[off])), text_.size() - off);
                const int idx = int(symbols_.size());
                symbols_.push_back({idx - 1, off + n == text_.size() ? -1 : idx + 1, off, n});
                off += n;
            }
            if (symbols_.empty()) return;
            for (int i = 1; i < int(symbols_.size()); ++i) try_add_bigram(i - 1, i);

            while (!queue_.empty()) {
                const Bigram b = queue_.top();
                queue_.pop();
                Symbol& left = symbols_[size_t(b.left)];
                Symbol& right = symbols_[size_t(b.right)];
                // Stale entry: one side was merged away or grew since it was queued.
                if (left.n == 0 || right.n == 0 || left.n + right.n != b.size) continue;
                left.n += right.n;
                right.n = 0;
                left.next = right.next;
                if (right.next >= 0) symbols_[size_t(right.next)].prev = b.left;
                try_add_bigram(left.prev, b.left);
                try_add_bigram(b.left, left.next);
            }
            for (int i = 0; i != -1; i = symbols_[size_t(i)].next) resegment(symbols_[size_t(i)], out);
        }

    private:
        struct Symbol {
            int prev, next;
            size_t start, n;  // bytes of text_; n == 0 once merged into its left neighbour
        };
        struct Bigram {
            int left, right;
            float score;
            size_t size;
        };
        // Highest score first; equal scores: leftmost first.
        struct Order {
            bool operator()(const Bigram& l, const Bigram& r) const {
                return l.score < r.score || (l.score == r.score && l.left > r.left);
            }
        };

        void try_add_bigram(int left, int right) {
            if (left == -1 || right == -1) return;
            const Symbol& l = symbols_[size_t(left)];
            std::string text = text_.substr(l.start, l.n + symbols_[size_t(right)].n);
            const TokenId id = tok_.find_token(text);
            if (id < 0) return;
            const float score = tok_.vocab_.scores.empty() ? 0.0f : tok_.vocab_.scores[size_t(id)];
            queue_.push({left, right, score, text.size()});
            rev_merge_[std::move(text)] = {left, right};
        }

        // A final symbol: its token if it is one, else the pieces it was merged from (llama.cpp
        // keys that history by text), else one token per byte.
        void resegment(const Symbol& s, std::vector<TokenId>& out) {
            const std::string text = text_.substr(s.start, s.n);
            const TokenId id = tok_.find_token(text);
            if (id >= 0) {
                out.push_back(id);
                return;
            }
            const auto it = rev_merge_.find(text);
            if (it == rev_merge_.end()) {
                for (char c : text) {
                    const TokenId b = tok_.byte_token_[uint8_t(c)];
                    if (b < 0) {
                        fail("tokenizer: byte 0x{:02X} has no <0x{:02X}> token and the vocab has "
                             "no unknown token",
                             unsigned(uint8_t(c)), unsigned(uint8_t(c)));
                    }
                    out.push_back(b);
                }
                return;
            }
            const auto [l, r] = it->second;
            resegment(symbols_[size_t(l)], out);
            resegment(symbols_[size_t(r)], out);
        }

        const SpmTokenizer& tok_;
        const std::string& text_;
        std::vector<Symbol> symbols_;
        std::priority_queue<Bigram, std::vector<Bigram>, Order> queue_;
        std::unordered_map<std::string, std::pair<int, int>> rev_merge_;
    };

    // llama_token_to_piece(special = false) for SPM.
    std::string make_piece(TokenId id) const {
        const std::string& text = vocab_.tokens[size_t(id)];
        switch (type_of(id)) {
            case TokenType::Normal: {
                std::string s = text;
                replace_all(s, kSpace, " ");
                return s;
            }
            case TokenType::UserDefined:
                return text;
            case TokenType::Byte: {
                // "<0xXX>": llama.cpp reads the two hex digits at offset 3 (strtol, base 16).
                const std::string digits = text.size() > 3 ? text.substr(3, 2) : std::string();
                return std::string(1, char(std::strtol(digits.c_str(), nullptr, 16)));
            }
            default:  // control, unknown, unused, undefined
                return {};
        }
    }

    TokenId byte_token_[256];
};

}  // namespace

namespace detail {
std::unique_ptr<Tokenizer> make_spm_tokenizer(Vocab v) {
    return std::make_unique<SpmTokenizer>(std::move(v));
}
}  // namespace detail

}  // namespace vxq
