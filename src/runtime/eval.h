// Quality of KV methods against a reference cache on one model and text: perplexity in prefill
// and stream modes (llama-perplexity's chunks), the KL divergence of each method's next-token
// distribution from the reference's at every scored position (mean, median, p99, max), top-1
// agreement, resident KV bytes and bits/element, and attention fidelity on sampled decode steps
// (runtime/attention_probe.h). The reference (default f16, the llama.cpp-parity cache) runs the
// same chunks in the same mode, so a method equal to the reference has KL 0 exactly.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "kv/evict.h"
#include "kv/spec.h"
#include "runtime/perplexity.h"

namespace vxq {

class Model;
class Backend;

// A KV method as eval names it: "q4_0" (K and V) or "q4_0/f16" (K q4_0, V f16), optionally with
// an eviction policy after '@' ("f16@knorm:budget=128", "kivi:bits=4@qfilters:budget=256,calib=F";
// stream mode only: eviction acts between forward passes).
struct EvalMethod {
    std::string label, k, v;  // as given; canonical K and V methods
    KvSpec spec;
    EvictSpec evict;          // none unless '@' gives one
    static EvalMethod parse(const std::string& text);  // vxq::Error on an empty half or a bad method
};

struct Distribution {
    int64_t n = 0;
    double mean = 0, median = 0, p99 = 0, max = 0, min = 0;
    static Distribution of(std::vector<double> values);  // NaNs are left out
};

struct ModeEval {
    PplMode mode = PplMode::Prefill;
    double ppl = 0, ppl_err = 0;
    double ppl_ref = 0;         // the reference's, same chunks and mode
    Distribution kl;            // KL(reference || method) per scored token, nats
    double top1 = 0;            // fraction of scored tokens whose argmax equals the reference's
    int64_t n_scored = 0;
    size_t kv_bytes = 0;        // resident at the end of a chunk
    int64_t kv_tokens = 0;
    double bits_per_element = 0;
    // Attention fidelity (stream mode, sampled steps; n = 0 when not sampled).
    Distribution score_corr;    // Pearson correlation of exact vs cache scores, per (step, layer, head)
    Distribution out_rel_err;   // ||o - o*|| / ||o*|| of the attention output
};

struct MethodEval {
    EvalMethod method;
    std::string format;
    std::vector<ModeEval> modes;  // in EvalParams::modes order
};

struct EvalParams {
    int64_t n_ctx = 512;
    int64_t n_chunks = -1;
    std::vector<PplMode> modes{PplMode::Prefill, PplMode::Stream};
    std::vector<EvalMethod> methods;
    EvalMethod reference = EvalMethod::parse("f16");
    int64_t attn_every = 64;    // stream mode: probe attention every this many scored steps (0: off)
    bool prefill_exact = false;
    bool flash_attn = false;
    std::string device = "cpu";  // the backend's --device name, for the memory check's error
};

struct EvalResult {
    std::string reference_format;
    int64_t n_ctx = 0, n_chunks = 0, n_text_tokens = 0;
    std::vector<MethodEval> methods;
    double seconds = 0;
};

// progress(done, total) after each (mode, chunk, method) run.
EvalResult run_eval(const Model& model, Backend& be, std::string_view text, const EvalParams& p,
                    const std::function<void(int64_t, int64_t)>& progress = {});

const char* mode_name(PplMode m);

}  // namespace vxq
