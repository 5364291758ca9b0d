// Text generation: prefill the prompt in one batch, then decode token by token until EOS or
// n_predict tokens, streaming complete UTF-8 text to a callback.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "formats/tokenizer.h"
#include "runtime/sampler.h"

namespace vxq {

class Model;
class Backend;
class KvCache;
class Runner;

struct GenerateParams {
    int32_t n_predict = 128;   // < 0 is rejected; 0 generates nothing
    SamplerParams sampler;
};

struct GenerateResult {
    std::vector<TokenId> prompt_ids;
    std::vector<TokenId> ids;     // generated tokens only
    std::string text;             // detokenized continuation
    std::string stop_reason;      // "eos" or "n_predict"
    double prompt_ms = 0.0;
    double decode_ms = 0.0;
};

// Tokenizes the prompt (BOS as the vocab says, special tokens parsed as llama.cpp's CLI does),
// checks it fits the cache with room for at least one generated token, then generates.
// vxq::Error for invalid UTF-8, an empty prompt, or a prompt that does not fit.
GenerateResult generate(const Model& model, Backend& be, KvCache& cache, std::string_view prompt,
                        const GenerateParams& p, const std::function<void(std::string_view)>& on_text = {});
// The same through a Runner (one backend, or a tensor-parallel group).
GenerateResult generate(Runner& run, std::string_view prompt, const GenerateParams& p,
                        const std::function<void(std::string_view)>& on_text = {});

}  // namespace vxq
