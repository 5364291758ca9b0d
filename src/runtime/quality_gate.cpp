#include "runtime/quality_gate.h"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace vxq {

namespace {

double number(const nlohmann::ordered_json& j, const std::string& where) {
    if (!j.is_number()) fail("{}: expected a number", where);
    const double v = j.get<double>();
    if (!std::isfinite(v) || v < 0) fail("{}: expected a finite number >= 0", where);
    return v;
}

}  // namespace

QualityGate QualityGate::parse(const std::string& json_text, const std::string& source) {
    nlohmann::ordered_json j;  // methods keep the file's order
    try {
        j = nlohmann::ordered_json::parse(json_text);
    } catch (const nlohmann::json::exception& e) {
        fail("{}: not valid JSON ({})", source, e.what());
    }
    if (!j.is_object()) fail("{}: expected a JSON object", source);
    QualityGate g;
    for (const auto& [key, val] : j.items()) {
        const std::string where = fmt::format("{}: '{}'", source, key);
        if (key == "about") continue;
        if (key == "model" || key == "text") {
            if (!val.is_string() || val.get<std::string>().empty()) fail("{}: expected a file name", where);
            (key == "model" ? g.model : g.text) = val.get<std::string>();
        } else if (key == "ctx" || key == "chunks") {
            if (!val.is_number_integer() || val.get<int64_t>() <= 0) fail("{}: expected a positive integer", where);
            (key == "ctx" ? g.n_ctx : g.n_chunks) = val.get<int64_t>();
        } else if (key == "mode") {
            if (val != "stream" && val != "prefill") fail("{}: expected \"stream\" or \"prefill\"", where);
            g.mode = val == "stream" ? PplMode::Stream : PplMode::Prefill;
        } else if (key == "limits") {
            if (!val.is_object() || val.empty()) fail("{}: expected an object of methods", where);
            for (const auto& [method, lim] : val.items()) {
                if (!lim.is_object()) fail("{}.{}: expected an object of limits", where, method);
                EvalMethod::parse(method);  // a malformed method name fails here, naming itself
                GateLimit l;
                l.method = method;
                for (const auto& [name, x] : lim.items()) {
                    const std::string w = fmt::format("{}.{}.{}", where, method, name);
                    if (name == "kl_mean") l.kl_mean = number(x, w);
                    else if (name == "kl_p99") l.kl_p99 = number(x, w);
                    else if (name == "kl_max") l.kl_max = number(x, w);
                    else if (name == "ppl_delta") l.ppl_delta = number(x, w);
                    else if (name == "top1_min") l.top1_min = number(x, w);
                    else if (name != "measured") fail("{}: unknown limit (kl_mean, kl_p99, kl_max, ppl_delta, top1_min)", w);
                }
                g.limits.push_back(l);
            }
        } else {
            fail("{}: unknown key (about, model, text, ctx, chunks, mode, limits)", where);
        }
    }
    if (g.model.empty() || g.text.empty() || g.n_ctx == 0 || g.n_chunks == 0 || g.limits.empty()) {
        fail("{}: a gate needs model, text, ctx, chunks and limits", source);
    }
    return g;
}

EvalParams QualityGate::eval_params() const {
    EvalParams p;
    p.n_ctx = n_ctx;
    p.n_chunks = n_chunks;
    p.modes = {mode};
    p.attn_every = 0;
    for (const GateLimit& l : limits) p.methods.push_back(EvalMethod::parse(l.method));
    return p;
}

std::vector<std::string> check_gate(const QualityGate& gate, const EvalResult& r) {
    std::vector<std::string> out;
    for (const GateLimit& l : gate.limits) {
        const ModeEval* e = nullptr;
        for (const MethodEval& m : r.methods) {
            if (m.method.label != l.method) continue;
            for (const ModeEval& me : m.modes) {
                if (me.mode == gate.mode) e = &me;
            }
        }
        if (!e) {
            out.push_back(fmt::format("{}: not evaluated in {} mode", l.method, mode_name(gate.mode)));
            continue;
        }
        auto upper = [&](const char* what, const std::optional<double>& lim, double v) {
            if (lim && !(v <= *lim)) out.push_back(fmt::format("{}: {} = {:.6g} exceeds the limit {:.6g}", l.method, what, v, *lim));
        };
        upper("kl_mean", l.kl_mean, e->kl.mean);
        upper("kl_p99", l.kl_p99, e->kl.p99);
        upper("kl_max", l.kl_max, e->kl.max);
        upper("ppl_delta", l.ppl_delta, e->ppl / e->ppl_ref - 1.0);
        if (l.top1_min && !(e->top1 >= *l.top1_min)) {
            out.push_back(fmt::format("{}: top1 = {:.4f} is below the limit {:.4f}", l.method, e->top1, *l.top1_min));
        }
    }
    return out;
}

}  // namespace vxq
