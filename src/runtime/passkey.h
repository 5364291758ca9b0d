// Pass-key retrieval (../shared/assets/passkey/): a 5-digit key hidden at some depth of filler
// text, asked for at the end. A case is right when greedy decoding of up to 8 new tokens, with
// leading whitespace removed, starts with the answer (the set's own "check" rule). It measures
// whether a KV method (or an eviction policy) keeps one far-away token usable.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace vxq {

class Model;
class Backend;
class KvCache;

struct PasskeyCase {
    std::string id;
    std::string prompt;
    std::string answer;
    int64_t target_tokens = 0;  // the prompt length class (1024, 2048, 4000)
    int64_t prompt_tokens = 0;  // the file's count with BOS (the vxq tokenizer's)
    double depth = 0.0;         // where the key sits, as a fraction of the filler
};

struct PasskeySet {
    std::string name;
    std::vector<PasskeyCase> cases;
};

// Parses the set's JSON; vxq::Error naming `where` and the field for anything missing or malformed.
PasskeySet parse_passkey_set(std::string_view json_text, const std::string& where);

// Whether generated text answers: leading whitespace removed, it starts with the answer.
bool passkey_correct(std::string_view text, std::string_view answer);

// The cases of the given prompt length classes (all when `lengths` is empty); vxq::Error naming
// `where` when none is left.
std::vector<const PasskeyCase*> select_passkey_cases(const PasskeySet& set, const std::vector<int64_t>& lengths,
                                                     const std::string& where);

struct PasskeyOutcome {
    const PasskeyCase* c = nullptr;
    int64_t prompt_tokens = 0;  // as tokenized now (differs from the file's only with another tokenizer)
    std::string text;           // the greedy continuation
    bool correct = false;
    double seconds = 0.0;
};

constexpr int32_t kPasskeyNewTokens = 8;

// Right answers of a run, in all and per prompt length class.
struct PasskeyTally {
    int correct = 0, total = 0;
    std::map<int64_t, std::pair<int, int>> by_length;  // length class -> (correct, total)
};
PasskeyTally tally_passkey(const std::vector<PasskeyOutcome>& outcomes);

// Runs the cases (greedy, kPasskeyNewTokens new tokens each) with `cache`, which must hold the
// longest prompt plus those tokens; `progress(done, total)` after each case.
std::vector<PasskeyOutcome> run_passkey(const Model& model, Backend& be, KvCache& cache,
                                        const std::vector<const PasskeyCase*>& cases,
                                        const std::function<void(size_t, size_t)>& progress = {});

}  // namespace vxq
