// The smallest use of the library: load a GGUF model, tokenize a prompt, generate greedily.
//   simple_generate MODEL.gguf "prompt text"
#include <cstdio>

#include "core/error.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "runtime/generate.h"

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s MODEL.gguf PROMPT\n", argv[0]);
        return 2;
    }
    try {
        const auto model = vxq::Model::load(argv[1]);
        const vxq::ModelConfig& c = model->config();

        const auto ids = model->tokenizer().encode(argv[2], /*add_special=*/true);
        std::printf("prompt: %zu tokens\n", ids.size());

        auto backend = vxq::make_backend("cpu", /*n_threads=*/2);
        auto cache = vxq::make_kv_cache(vxq::KvShape{c.n_layer, c.n_head, c.n_head_kv, c.head_dim, /*n_ctx=*/512}, vxq::KvSpec{});
        vxq::GenerateParams p;
        p.n_predict = 32;
        p.sampler.temperature = 0.0f;  // greedy
        const auto r = vxq::generate(*model, *backend, *cache, argv[2], p);
        std::printf("%s%s\n", argv[2], r.text.c_str());
    } catch (const vxq::Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
