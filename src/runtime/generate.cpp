#include "runtime/generate.h"

#include <chrono>

#include "core/error.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "runtime/runner.h"

namespace vxq {

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

GenerateResult generate(const Model& model, Backend& be, KvCache& cache, std::string_view prompt,
                        const GenerateParams& p, const std::function<void(std::string_view)>& on_text) {
    SingleRunner run(model, be, cache);
    return generate(run, prompt, p, on_text);
}

GenerateResult generate(Runner& run, std::string_view prompt, const GenerateParams& p,
                        const std::function<void(std::string_view)>& on_text) {
    const Model& model = run.model();
    if (p.n_predict < 0) fail("number of tokens to predict must be >= 0, got {}", p.n_predict);
    GenerateResult r;
    r.prompt_ids = model.tokenizer().encode(prompt, /*add_special=*/true, /*parse_special=*/true);
    if (r.prompt_ids.empty()) fail("the prompt is empty");
    const int64_t n_ctx = run.n_ctx();
    if (int64_t(r.prompt_ids.size()) + (p.n_predict > 0 ? 1 : 0) > n_ctx) {
        fail("the prompt is {} tokens, longer than the context of {} tokens (raise -c)", r.prompt_ids.size(), n_ctx);
    }

    const int64_t n_vocab = model.config().n_vocab;
    std::vector<float> own;
    float* out = run.output_buffer(static_cast<size_t>(n_vocab));  // the backend's, where it has one
    if (!out) {
        own.resize(static_cast<size_t>(n_vocab));
        out = own.data();
    }
    const std::span<const float> logits(out, static_cast<size_t>(n_vocab));
    Sampler sampler(p.sampler);
    Utf8Stream utf8;

    auto t0 = std::chrono::steady_clock::now();
    run.truncate(0);
    run.forward(r.prompt_ids, 1, out);
    r.prompt_ms = ms_since(t0);

    r.stop_reason = "n_predict";
    t0 = std::chrono::steady_clock::now();
    for (int32_t i = 0; i < p.n_predict; ++i) {
        const TokenId next = sampler.sample(logits);
        if (model.tokenizer().is_eog(next)) {
            r.stop_reason = "eos";
            break;
        }
        r.ids.push_back(next);
        const std::string text = utf8.push(model.tokenizer().token_to_piece(next));
        r.text += text;
        if (on_text && !text.empty()) on_text(text);
        if (i + 1 == p.n_predict) break;
        if (run.size() >= n_ctx) {
            r.stop_reason = "context_full";
            break;
        }
        const TokenId one[1] = {next};
        run.forward(one, 1, out);
    }
    r.decode_ms = ms_since(t0);
    const std::string rest = utf8.finish();
    r.text += rest;
    if (on_text && !rest.empty()) on_text(rest);
    return r;
}

}  // namespace vxq
