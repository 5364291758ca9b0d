// The quality gate: limits per KV method on a small, fast eval, stored in the repo
// (tests/data/gate/*.json) and checked in CI, so a change that degrades a codec fails the build.
// A gate file names the model and text (file names under the shared assets), the eval settings
// and, per method, any of: kl_mean, kl_p99, kl_max (nats, upper limits), ppl_delta (relative
// perplexity increase over the reference, upper limit), top1_min (agreement, lower limit).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "runtime/eval.h"

namespace vxq {

struct GateLimit {
    std::string method;
    std::optional<double> kl_mean, kl_p99, kl_max, ppl_delta, top1_min;
};

struct QualityGate {
    std::string model, text;  // file names (basename) the limits were set for
    int64_t n_ctx = 0, n_chunks = 0;
    PplMode mode = PplMode::Stream;
    std::vector<GateLimit> limits;

    // vxq::Error naming the source and the problem for malformed JSON, unknown keys or bad values.
    static QualityGate parse(const std::string& json_text, const std::string& source);
    EvalParams eval_params() const;  // the gate's methods, chunks and mode (no attention probes)
};

// One line per violated limit (empty: the gate passes). A gated method missing from the result
// is a violation too.
std::vector<std::string> check_gate(const QualityGate& gate, const EvalResult& r);

}  // namespace vxq
