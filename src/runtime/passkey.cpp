#include "runtime/passkey.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "runtime/generate.h"

namespace vxq {

PasskeySet parse_passkey_set(std::string_view json_text, const std::string& where) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(json_text);
    } catch (const nlohmann::json::exception& e) {
        fail("{}: not a pass-key set: invalid JSON ({})", where, e.what());
    }
    const auto field = [&](const nlohmann::json& o, const char* key, const std::string& in) -> const nlohmann::json& {
        if (!o.is_object() || !o.contains(key)) fail("{}: {} has no \"{}\"", where, in, key);
        return o[key];
    };
    PasskeySet s;
    try {
        s.name = field(j, "name", "the set").get<std::string>();
        const nlohmann::json& cases = field(j, "cases", "the set");
        if (!cases.is_array() || cases.empty()) fail("{}: \"cases\" is not a non-empty array", where);
        for (size_t i = 0; i < cases.size(); ++i) {
            const std::string in = "case " + std::to_string(i);
            PasskeyCase c;
            c.id = field(cases[i], "id", in).get<std::string>();
            c.prompt = field(cases[i], "prompt", in).get<std::string>();
            c.answer = field(cases[i], "answer", in).get<std::string>();
            c.target_tokens = field(cases[i], "target_tokens", in).get<int64_t>();
            c.prompt_tokens = field(cases[i], "prompt_tokens", in).get<int64_t>();
            c.depth = field(cases[i], "depth", in).get<double>();
            if (c.answer.empty() || c.prompt.empty()) fail("{}: case {} has an empty prompt or answer", where, c.id);
            s.cases.push_back(std::move(c));
        }
    } catch (const nlohmann::json::exception& e) {
        fail("{}: not a pass-key set: a field of the wrong type ({})", where, e.what());
    }
    return s;
}

std::vector<const PasskeyCase*> select_passkey_cases(const PasskeySet& set, const std::vector<int64_t>& lengths,
                                                     const std::string& where) {
    std::vector<const PasskeyCase*> cases;
    for (const PasskeyCase& c : set.cases) {
        if (lengths.empty() || std::find(lengths.begin(), lengths.end(), c.target_tokens) != lengths.end()) cases.push_back(&c);
    }
    if (cases.empty()) fail("{}: no case of length {}", where, fmt::join(lengths, ","));
    return cases;
}

PasskeyTally tally_passkey(const std::vector<PasskeyOutcome>& outcomes) {
    PasskeyTally t;
    for (const PasskeyOutcome& r : outcomes) {
        auto& [ok, n] = t.by_length[r.c->target_tokens];
        ok += r.correct;
        ++n;
        t.correct += r.correct;
        ++t.total;
    }
    return t;
}

bool passkey_correct(std::string_view text, std::string_view answer) {
    size_t i = 0;
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r')) ++i;
    return !answer.empty() && text.substr(i).starts_with(answer);
}

std::vector<PasskeyOutcome> run_passkey(const Model& model, Backend& be, KvCache& cache,
                                        const std::vector<const PasskeyCase*>& cases,
                                        const std::function<void(size_t, size_t)>& progress) {
    GenerateParams g;
    g.n_predict = kPasskeyNewTokens;
    g.sampler.temperature = 0.0f;  // greedy
    std::vector<PasskeyOutcome> out;
    for (const PasskeyCase* c : cases) {
        const auto t0 = std::chrono::steady_clock::now();
        const GenerateResult r = generate(model, be, cache, c->prompt, g);
        PasskeyOutcome o;
        o.c = c;
        o.prompt_tokens = int64_t(r.prompt_ids.size());
        o.text = r.text;
        o.correct = passkey_correct(r.text, c->answer);
        o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        out.push_back(std::move(o));
        if (progress) progress(out.size(), cases.size());
    }
    return out;
}

}  // namespace vxq
