// vxq tokenize -m MODEL -p TEXT: the token ids as a JSON list.
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/model.h"
#include "tools/commands.h"

namespace vxq::tools {

namespace {
struct TokenizeOptions {
    std::string model;
    std::string prompt;
    bool no_bos = false;
    bool parse_special = false;
};
}  // namespace

void add_tokenize(CLI::App& app, int& rc) {
    auto* sub = app.add_subcommand("tokenize", "Print the token ids of a text as a JSON list");
    auto o = std::make_shared<TokenizeOptions>();
    sub->add_option("-m,--model", o->model, "GGUF model file")->required();
    sub->add_option("-p,--prompt", o->prompt, "text to tokenize")->required();
    sub->add_flag("--no-bos", o->no_bos, "do not add BOS/EOS even if the vocabulary asks for it");
    sub->add_flag("--parse-special", o->parse_special, "turn special-token texts such as <s> into their ids");
    sub->callback([o, &rc] {
        const auto model = Model::load(o->model);
        const auto ids = model->tokenizer().encode(o->prompt, !o->no_bos, o->parse_special);
        fmt::print("{}\n", nlohmann::json(ids).dump());
        rc = 0;
    });
}

}  // namespace vxq::tools
