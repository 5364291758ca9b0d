#include <gtest/gtest.h>

#include <string>

#include "backend/backend.h"
#include "core/error.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "runtime/passkey.h"
#include "support/assets.h"
#include "support/text.h"

namespace vxq {
namespace {

using test::read_file;

TEST(Passkey, CorrectWhenTheTextStartsWithTheAnswerAfterWhitespace) {
    EXPECT_TRUE(passkey_correct(" 28589. Remember", "28589"));
    EXPECT_TRUE(passkey_correct("\n\t28589", "28589"));
    EXPECT_FALSE(passkey_correct(" 2858", "28589"));
    EXPECT_FALSE(passkey_correct(" the pass key 28589", "28589"));
    EXPECT_FALSE(passkey_correct("28589", ""));
}

TEST(Passkey, ParsesTheSetAndNamesWhatIsWrong) {
    const PasskeySet s = parse_passkey_set(
        R"({"name": "t", "cases": [{"id": "a", "prompt": "p", "answer": "12345", "target_tokens": 1024, "prompt_tokens": 1020, "depth": 0.25}]})",
        "t.json");
    ASSERT_EQ(s.cases.size(), 1u);
    EXPECT_EQ(s.cases[0].answer, "12345");
    EXPECT_EQ(s.cases[0].target_tokens, 1024);
    EXPECT_DOUBLE_EQ(s.cases[0].depth, 0.25);
    const auto error_of = [](const char* json) {
        try {
            parse_passkey_set(json, "t.json");
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_NE(error_of("{").find("invalid JSON"), std::string::npos);
    EXPECT_NE(error_of(R"({"name": "t"})").find("has no \"cases\""), std::string::npos);
    EXPECT_NE(error_of(R"({"name": "t", "cases": []})").find("non-empty array"), std::string::npos);
    EXPECT_NE(error_of(R"({"name": "t", "cases": [{"id": 5}]})").find("wrong type"), std::string::npos);
}

// The pass-key model finds the key in the set's shortest cases with an f16 cache (llama.cpp:
// 120/120); the tokenizer gives the file's prompt lengths.
TEST(Passkey, TheModelRetrievesKeysWithAnF16Cache) {
    const std::string rel = "assets/models/vxq-passkey-h64-f16.gguf", set_rel = "assets/passkey/passkey_wikitext.json";
    VXQ_REQUIRE_ASSET(rel);
    VXQ_REQUIRE_ASSET(set_rel);
    auto model = Model::load(test::shared_path(rel));
    auto be = make_backend("cpu", 2);
    const PasskeySet set = parse_passkey_set(read_file(test::shared_path(set_rel)), set_rel);
    ASSERT_EQ(set.cases.size(), 120u);
    std::vector<const PasskeyCase*> cases;
    for (const PasskeyCase& c : set.cases) {
        if (c.target_tokens == 1024 && cases.size() < 4) cases.push_back(&c);
    }
    const ModelConfig& c = model->config();
    auto cache = make_kv_cache(KvShape{c.n_layer, c.n_head, c.n_head_kv, c.head_dim, 1100}, KvSpec{});
    const auto out = run_passkey(*model, *be, *cache, cases);
    ASSERT_EQ(out.size(), cases.size());
    for (const PasskeyOutcome& o : out) {
        EXPECT_EQ(o.prompt_tokens, o.c->prompt_tokens) << o.c->id;
        EXPECT_TRUE(o.correct) << o.c->id << ": answer " << o.c->answer << ", got \"" << o.text << "\"";
    }
}

}  // namespace
}  // namespace vxq
