// One forward pass over many sequences (Model::forward over SeqBatch), on stories260K and, when
// set up, SmolLM2-135M: sequences in prefill (1 to 300 tokens), in chunked prefill, decoding one
// token after prefixes that end inside and at the edge of a block, verifying a causal chain and
// an 8-node token tree - each in its own scattered blocks of one shared PagedKvStorage, all in
// one pass on 2 threads - get bitwise the logits, hidden states and K/V that each gets alone
// through a contiguous KvCache with the same history (whose prefix was also computed in one
// batched pass). The order of the sequences in the batch and the thread count change nothing. A
// batch of no sequences returns nothing; a batch with one sequence whose table is too small (or
// a bad token) throws specdec::Error and leaves every block as it was. Negative control: a table
// with two blocks swapped changes that sequence's logits (and only its).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/thread_pool.h"
#include "common/test_paths.h"
#include "kv/kv_cache.h"
#include "kv/paged_kv.h"
#include "model/forward_scratch.h"
#include "model/gguf.h"
#include "model/model.h"
#include "speculative/token_tree.h"
#include "util/check.h"

namespace specdec {
namespace {

// The 8-node tree the verifying sequence checks: node i hangs under kTreeParents[i], so some
// nodes see new-token slots that are not contiguous.
const std::vector<int> kTreeParents = {-1, 0, 1, 0, 3, 1, 5, 3};

// One sequence of the batch: `prefix` tokens cached (run earlier), then `n_new` tokens in the
// pass - a causal chain, or the tree above (n_new = 8).
struct SeqSpec {
  const char* name;
  int64_t prefix;
  int64_t n_new;
  bool tree = false;
};

const SeqSpec kSpecs[] = {
    {"prefill 300", 0, 300},
    {"prefill 1", 0, 1},
    {"chunked prefill 37 after 20", 20, 37},
    {"decode after 1", 1, 1},
    {"decode after 63", 63, 1},  // the new token opens block 4 (16-slot blocks)
    {"decode after 200", 200, 1},
    {"tree of 8 after 45", 45, 8, true},
    {"chain of 8 after 130", 130, 8},
    {"idle, 10 cached", 10, 0},  // in the batch with no new tokens
};

// A sequence's tokens, batch and results, and its blocks in the shared storage.
struct Seq {
  SeqSpec spec;
  std::vector<int32_t> history;    // [prefix]
  std::vector<int32_t> tokens;     // [n_new]
  std::vector<int32_t> positions;  // [n_new]
  std::vector<uint8_t> mask;       // [n_new, n_new] (tree) or empty
  std::vector<int32_t> rows;       // output rows
  std::vector<int32_t> table;      // its blocks
  // Alone through a KvCache: [rows, n_vocab], [rows, dim], and the cache afterwards.
  std::vector<float> logits, hidden;
  std::unique_ptr<KvCache> alone;

  ForwardBatch batch(bool want_hidden) const {
    ForwardBatch b;
    b.tokens = tokens;
    b.positions = positions;
    b.mask = mask;
    b.output_rows = rows;
    b.want_hidden = want_hidden;
    return b;
  }
};

ForwardBatch chain_batch(const std::vector<int32_t>& tokens, std::vector<int32_t>* positions,
                         int64_t past) {
  positions->resize(tokens.size());
  std::iota(positions->begin(), positions->end(), static_cast<int32_t>(past));
  ForwardBatch b;
  b.tokens = tokens;
  b.positions = *positions;
  return b;
}

std::vector<Seq> make_seqs(const Model& model, std::mt19937& gen) {
  std::uniform_int_distribution<int32_t> token(1, model.config().n_vocab - 1);
  std::vector<Seq> seqs;
  for (const SeqSpec& spec : kSpecs) {
    Seq s;
    s.spec = spec;
    for (int64_t i = 0; i < spec.prefix; ++i) s.history.push_back(token(gen));
    for (int64_t i = 0; i < spec.n_new; ++i) s.tokens.push_back(token(gen));
    if (spec.tree) {
      TokenTree tree;
      tree.reset(s.tokens[0]);
      for (size_t i = 1; i < kTreeParents.size(); ++i) tree.add(kTreeParents[i], s.tokens[i]);
      tree.build_mask(&s.mask);
      tree.build_positions(spec.prefix, &s.positions);
      for (int i = 0; i < tree.size(); ++i) s.rows.push_back(i);
    } else {
      s.positions.resize(s.tokens.size());
      std::iota(s.positions.begin(), s.positions.end(), static_cast<int32_t>(spec.prefix));
      // First, middle and last row (decode: its one row).
      for (int64_t r : {int64_t{0}, spec.n_new / 2, spec.n_new - 1}) {
        if (r >= 0 && r < spec.n_new && (s.rows.empty() || r > s.rows.back())) {
          s.rows.push_back(static_cast<int32_t>(r));
        }
      }
    }
    seqs.push_back(std::move(s));
  }
  return seqs;
}

// Hands out the blocks of a storage of n_blocks in random order: each sequence's table is
// scattered over the storage (with the odd consecutive pair).
std::vector<int32_t> shuffled_blocks(int32_t n_blocks, std::mt19937& gen) {
  std::vector<int32_t> ids(static_cast<size_t>(n_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), gen);
  return ids;
}

// Every slot of every block of every layer: [n_layers, n_blocks * block_slots, row] K then V.
std::vector<float> snapshot(const PagedKvStorage& kv) {
  std::vector<int32_t> every(static_cast<size_t>(kv.n_blocks()));
  std::iota(every.begin(), every.end(), 0);
  const int64_t n = kv.n_blocks() * kv.block_slots();
  const auto layer_elems = static_cast<size_t>(n * kv.row_elems());
  std::vector<float> out(2 * layer_elems * kv.n_layers());
  for (int l = 0; l < kv.n_layers(); ++l) {
    kv.read(l, every, 0, n, out.data() + 2 * l * layer_elems,
            out.data() + (2 * l + 1) * layer_elems);
  }
  return out;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  // memcmp's pointers must not be null even for 0 bytes (an empty span's may be).
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Index of the first element whose bits differ, or -1.
int64_t first_difference(const float* a, const float* b, int64_t n) {
  for (int64_t e = 0; e < n; ++e) {
    if (std::memcmp(a + e, b + e, sizeof(float)) != 0) return e;
  }
  return -1;
}

// The K/V rows of slots [0, n) of a sequence's table equal those of its KvCache, every layer.
void expect_same_kv(const PagedKvStorage& paged, const Seq& s, int64_t n, const char* when) {
  const auto elems = static_cast<size_t>(n * paged.row_elems());
  std::vector<float> pk(elems), pv(elems), ck(elems), cv(elems);
  for (int l = 0; l < paged.n_layers(); ++l) {
    paged.read(l, s.table, 0, n, pk.data(), pv.data());
    s.alone->read(l, 0, n, ck.data(), cv.data());
    EXPECT_TRUE(same_bits(pk, ck)) << s.spec.name << ": K of layer " << l << " " << when;
    EXPECT_TRUE(same_bits(pv, cv)) << s.spec.name << ": V of layer " << l << " " << when;
  }
}

// Runs the checks on one model with the given cache type and block size.
void check_batched_forward(Model& model, KvType type, int64_t block_slots, const char* name) {
  const ModelConfig& c = model.config();
  const int64_t n_vocab = c.n_vocab;
  std::mt19937 gen(42);
  ThreadPool pool(2);
  std::vector<Seq> seqs = make_seqs(model, gen);

  // 1. Each sequence alone, through its own KvCache (no pool): history, then the pass.
  for (Seq& s : seqs) {
    s.alone = std::make_unique<KvCache>(
        model.make_kv_cache(std::max<int64_t>(1, s.spec.prefix + s.spec.n_new), type));
    if (s.spec.prefix > 0) {
      std::vector<int32_t> positions;
      model.forward(*s.alone, chain_batch(s.history, &positions, 0), nullptr);
    }
    if (s.spec.n_new == 0) continue;
    const ForwardResult r = model.forward(*s.alone, s.batch(true), nullptr);
    ASSERT_EQ(r.logits.size(), s.rows.size() * n_vocab) << s.spec.name;
    ASSERT_EQ(r.hidden.size(), s.rows.size() * c.dim) << s.spec.name;
    s.logits.assign(r.logits.begin(), r.logits.end());
    s.hidden.assign(r.hidden.begin(), r.hidden.end());
  }

  // 2. The shared storage: every sequence gets the blocks its slots need, one spare for some,
  // from a shuffled list; a few blocks stay unused.
  int32_t n_blocks = 3;
  for (const Seq& s : seqs) {
    n_blocks +=
        static_cast<int32_t>((s.spec.prefix + s.spec.n_new + block_slots - 1) / block_slots) + 1;
  }
  PagedKvStorage storage(c.n_layers, c.n_kv_heads, c.head_dim, n_blocks, block_slots, type);
  const std::vector<int32_t> ids = shuffled_blocks(n_blocks, gen);
  size_t next = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    Seq& s = seqs[i];
    const int64_t need = (s.spec.prefix + s.spec.n_new + block_slots - 1) / block_slots + i % 2;
    for (int64_t b = 0; b < need; ++b) s.table.push_back(ids[next++]);
  }
  ForwardScratch scratch;

  // 3. The histories of all sequences in one batched pass (no output rows); then their K/V
  // equal those each cache got alone.
  {
    std::vector<std::vector<int32_t>> positions(seqs.size());
    std::vector<SeqBatch> batch;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (seqs[i].spec.prefix == 0) continue;
      batch.push_back(
          {SeqKv{&storage, seqs[i].table, 0}, chain_batch(seqs[i].history, &positions[i], 0)});
    }
    const ForwardResult r = model.forward(batch, &pool, &scratch);
    EXPECT_TRUE(r.logits.empty());
    EXPECT_TRUE(r.hidden.empty());
    for (const Seq& s : seqs) expect_same_kv(storage, s, s.spec.prefix, "after the history");
  }

  // 4. All sequences' passes in one batch, hidden states asked by one sequence only.
  auto make_batch = [&](const std::vector<size_t>& order, int want_hidden_of) {
    std::vector<SeqBatch> batch;
    for (size_t i : order) {
      const Seq& s = seqs[i];
      batch.push_back({SeqKv{&storage, s.table, s.spec.prefix},
                       s.batch(static_cast<int>(i) == want_hidden_of)});
    }
    return batch;
  };
  // Checks the result of a batch in `order` against the sequences alone.
  auto check_result = [&](const ForwardResult& r, const std::vector<size_t>& order,
                          const std::string& what) {
    size_t n_out = 0;
    for (size_t i : order) n_out += seqs[i].rows.size();
    ASSERT_EQ(r.logits.size(), n_out * n_vocab) << what;
    ASSERT_EQ(r.hidden.size(), n_out * c.dim) << what << ": hidden rows of every sequence";
    size_t row = 0;
    for (size_t i : order) {
      const Seq& s = seqs[i];
      for (size_t k = 0; k < s.rows.size(); ++k, ++row) {
        const int64_t e = first_difference(r.logits.data() + row * n_vocab,
                                           s.logits.data() + k * n_vocab, n_vocab);
        EXPECT_EQ(e, -1) << what << ": " << s.spec.name << " row " << s.rows[k]
                         << " logits differ from the sequence alone at " << e;
        const int64_t h =
            first_difference(r.hidden.data() + row * c.dim, s.hidden.data() + k * c.dim, c.dim);
        EXPECT_EQ(h, -1) << what << ": " << s.spec.name << " row " << s.rows[k]
                         << " hidden state differs from the sequence alone at " << h;
      }
    }
  };
  std::vector<size_t> order(seqs.size());
  std::iota(order.begin(), order.end(), 0);
  const int tree_index = 6;
  ASSERT_TRUE(seqs[tree_index].spec.tree);
  {
    const std::vector<SeqBatch> batch = make_batch(order, tree_index);
    const ForwardResult r = model.forward(batch, &pool, &scratch);
    check_result(r, order, std::string(name) + " batch of " + std::to_string(seqs.size()));
    for (const Seq& s : seqs) {
      expect_same_kv(storage, s, s.spec.prefix + s.spec.n_new, "after the pass");
    }
  }
  // The same pass again (it rewrites the same K/V) in reverse order, without a pool.
  {
    std::vector<size_t> reversed(order.rbegin(), order.rend());
    const std::vector<SeqBatch> batch = make_batch(reversed, 0);
    const ForwardResult r = model.forward(batch, nullptr, &scratch);
    check_result(r, reversed, std::string(name) + " reversed, one thread");
  }

  // 5. No sequences: nothing.
  {
    const ForwardResult r = model.forward(std::span<const SeqBatch>{}, &pool, &scratch);
    EXPECT_TRUE(r.logits.empty());
    EXPECT_TRUE(r.hidden.empty());
  }

  // 6. A batch with one sequence whose table is one block short, or whose token is outside the
  // vocabulary, throws and writes nothing anywhere (the other sequences come before and after
  // it, and would have fitted).
  {
    const std::vector<float> before = snapshot(storage);
    const Seq& d = seqs[5];  // decode after 200
    const std::vector<int32_t> short_table(d.table.begin(),
                                           d.table.begin() + d.spec.prefix / block_slots);
    ASSERT_LT(static_cast<int64_t>(short_table.size()) * block_slots, d.spec.prefix + 1);
    std::vector<SeqBatch> batch = make_batch({2, 3, 5, 6, 0}, -1);
    batch[2].kv.table = short_table;
    EXPECT_THROW(model.forward(batch, &pool, &scratch), Error) << name;
    EXPECT_TRUE(same_bits(snapshot(storage), before)) << name << ": a failed pass wrote K/V";

    const std::vector<int32_t> bad_token = {static_cast<int32_t>(n_vocab)};
    batch = make_batch({2, 3, 5, 6, 0}, -1);
    batch[4].batch.tokens = {bad_token.data(), 1};
    batch[4].batch.positions = {seqs[3].positions.data(), 1};
    batch[4].batch.output_rows = {};
    EXPECT_THROW(model.forward(batch, &pool, &scratch), Error) << name;
    EXPECT_TRUE(same_bits(snapshot(storage), before)) << name << ": a failed pass wrote K/V";
  }

  // 7. Negative control: the decoding sequence read through its table with its first two blocks
  // swapped gets other logits; the others are unaffected. (Its new row lands in block 12, which
  // the swap leaves in place.)
  {
    std::vector<int32_t> swapped = seqs[5].table;
    std::swap(swapped[0], swapped[1]);
    std::vector<SeqBatch> batch = make_batch({3, 5, 6}, -1);
    batch[1].kv.table = swapped;
    const ForwardResult r = model.forward(batch, &pool, &scratch);
    ASSERT_EQ(r.logits.size(), (1 + 1 + 8) * static_cast<size_t>(n_vocab));
    EXPECT_EQ(first_difference(r.logits.data(), seqs[3].logits.data(), n_vocab), -1);
    EXPECT_NE(first_difference(r.logits.data() + n_vocab, seqs[5].logits.data(), n_vocab), -1)
        << name << ": swapping two blocks of a table changed nothing";
    EXPECT_EQ(first_difference(r.logits.data() + 2 * n_vocab, seqs[6].logits.data(), 8 * n_vocab),
              -1);
  }
  std::printf("%s (%s KV, %lld-slot blocks): %zu sequences, %d blocks\n", name, kv_type_name(type),
              static_cast<long long>(block_slots), seqs.size(), n_blocks);
}

TEST(BatchedForward, Stories260K) {
  auto model = Model::load(test::tiny_model("stories260K.gguf"));
  ASSERT_GE(model->config().n_ctx_train, 308);
  check_batched_forward(*model, KvType::kF16, 16, "stories260K");
}

TEST(BatchedForward, Stories260KFloatCache32SlotBlocks) {
  auto model = Model::load(test::tiny_model("stories260K.gguf"));
  check_batched_forward(*model, KvType::kF32, 32, "stories260K");
}

TEST(BatchedForward, Stories260KQ8Cache) {
  auto model = Model::load(test::tiny_model("stories260K.gguf"));
  check_batched_forward(*model, KvType::kQ8, 16, "stories260K");
}

TEST(BatchedForward, SmolLM2) {
  const std::string path = test::default_model_path();
  if (!test::file_exists(path)) {
    GTEST_SKIP() << "default model missing at " << path << "; run scripts/setup.sh";
  }
  auto model = Model::load(path);
  check_batched_forward(*model, KvType::kF16, 16, "SmolLM2");
}

}  // namespace
}  // namespace specdec
