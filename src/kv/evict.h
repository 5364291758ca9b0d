// Eviction (METHODS.md "Eviction"): a policy keeps at most a token budget per layer and KV head,
// always keeping the first `sink` tokens and a recent window, and the cache gives the evicted
// tokens' pages back at once (KvCache::retain). Kept tokens keep their positions (RoPE was applied
// at write time) and their causal visibility. Orthogonal to the codec: any --kv composes.
//
//   --evict POLICY[:budget=N | ratio=R][,sink=4][,window=64][,every=1][,calib=FILE][,obs=64]
//
// Policies (higher score = kept; the window and the sinks are kept whatever their score):
//   streaming  StreamingLLM: the sinks and the most recent tokens (score = position)
//   knorm      K-norm: the keys with the smallest L2 norm (score = -|k|)
//   qfilters   Q-Filters: score = <k, f> with f the calibrated filter of the (layer, KV head):
//              the first right singular vector of the head's post-RoPE queries, sign fixed so the
//              queries project positively on average, averaged over the KV group's query heads
//              (calib=FILE from `vxq calibrate --method qfilters`)
//   h2o        H2O: the tokens with the largest attention accumulated over every query so far
//              (the backend's attention mass output, summed over the group's query heads)
//   snapkv     SnapKV: the votes of the last `obs` queries (default 64): the attention each token
//              gets from them (softmax per query and query head, summed over the group's heads),
//              average-pooled over 5 neighbouring tokens. After a prompt the votes are computed
//              from the prompt's last queries and the cache's keys; after single-token steps they
//              are the backend's attention mass of those steps, kept per step.
// When: after every batch of more than one token (a prompt) and every `every` single-token
// steps. Between evictions a head holds at most budget + every - 1 tokens.
// Budget: tokens kept per head, sinks and window included; the default window (64) shrinks to
// (budget - sink) / 2 where it would leave fewer scored tokens than that; a window= given is kept
// (up to budget - sink). `ratio=R` keeps ceil(R x tokens seen) instead (at least sink + 2).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace vxq {

class KvCache;
struct KvShape;

enum class EvictPolicy { None, Streaming, KNorm, QFilters, H2O, SnapKV };

struct EvictSpec {
    EvictPolicy policy = EvictPolicy::None;
    int64_t budget = 0;   // tokens kept per (layer, KV head); 0 when ratio is given
    double ratio = 0.0;   // or this fraction of the tokens seen
    int64_t sink = 4, window = 64, every = 1;
    bool window_given = false;  // window= was set: kept as given (up to budget - sink)
    std::string calib;    // qfilters: the calibration file
    int64_t obs = 64;     // snapkv: the observation window (queries that vote)
    static constexpr int64_t kPool = 5;  // snapkv: the votes' average-pooling kernel

    bool active() const { return policy != EvictPolicy::None; }
    // "" is no eviction; vxq::Error on an unknown policy or option, or an out-of-range value.
    static EvictSpec parse(const std::string& text);
    std::string str() const;
    // Tokens a head keeps after `seen` positions, and the window within them.
    int64_t budget_for(int64_t seen) const;
    int64_t window_for(int64_t budget) const;
};

const char* evict_policy_name(EvictPolicy p);

// The keep mask of one head: its n stored tokens in position order, their scores (any order of
// magnitude; NaN counts as lowest), the budget, sinks and window. The first `sink` and the last
// `window` tokens are kept; of the others, the budget - sink - window highest scores (ties: the
// more recent). All kept when n <= budget.
std::vector<uint8_t> evict_keep_mask(std::span<const float> scores, int64_t budget, int64_t sink, int64_t window);

// The policy state of one cache: per (layer, KV head) H2O's accumulated attention, Q-Filters'
// filters. KvCache owns one when KvCacheOptions::evict is active and calls it.
class Evictor {
public:
    Evictor(const EvictSpec& spec, const KvShape& shape);
    ~Evictor();
    const EvictSpec& spec() const { return spec_; }
    // H2O and SnapKV read the attention mass of every step; SnapKV also the queries.
    bool wants_attention_mass() const { return spec_.policy == EvictPolicy::H2O || spec_.policy == EvictPolicy::SnapKV; }
    void add_attention_mass(int64_t layer, int64_t head, const float* mass, int64_t n_tokens);
    bool wants_queries() const { return spec_.policy == EvictPolicy::SnapKV; }
    //   q: [n_q, n_head, head_dim] after RoPE, positions pos0 ...
    void on_queries(int64_t layer, const float* q, int64_t n_q, int64_t pos0);
    // After a forward pass committed n_new tokens: evicts when due (see above).
    void after_commit(KvCache& cache, int64_t n_new);
    // After a rollback (KvCache::truncate): H2O's sums of dropped tokens go with them.
    void after_truncate(const KvCache& cache);
    // The scores of one head's stored tokens under the policy (tests, measurements).
    std::vector<float> scores(const KvCache& cache, int64_t layer, int64_t head) const;
    // Evicts now in every head above its budget; returns the tokens dropped.
    int64_t evict(KvCache& cache);
    // The Q-Filters filter of (layer, head): [head_dim] (empty for other policies).
    std::span<const float> filter(int64_t layer, int64_t head) const;

private:
    EvictSpec spec_;
    int64_t n_layer_, n_head_kv_, head_dim_;
    // SnapKV: the votes of a prompt's last queries, per stored token (a forward pass's queries
    // are kept until the cache commits).
    void vote_from_queries(const KvCache& cache, int64_t layer);
    // Applies a keep mask (of n stored tokens) to a per-token vector.
    static void compact(std::vector<float>& x, std::span<const uint8_t> keep, int64_t n);

    int64_t n_head_ = 0;
    int64_t steps_ = 0;                       // single-token steps since the last eviction
    std::vector<std::vector<float>> mass_;    // H2O: [layer * n_head_kv + head][stored token]
    std::vector<float> filters_;              // Q-Filters: [layer][head][head_dim]
    // SnapKV, per (layer, head): the votes of the last obs queries, one vector per query (oldest
    // first), and the mass of the step in flight; per layer the queries of a prompt in flight.
    std::vector<std::vector<std::vector<float>>> votes_;
    std::vector<std::vector<float>> step_mass_;
    std::vector<std::vector<float>> prompt_q_;   // [layer][query][n_head][head_dim]
    std::vector<int64_t> prompt_pos0_;           // [layer]: position of prompt_q_'s first query
};

}  // namespace vxq
