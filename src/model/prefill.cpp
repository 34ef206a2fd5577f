#include "model/prefill.h"

#include <algorithm>

#include "util/check.h"

namespace specdec {

std::vector<float> prefill(Model& model, KvCache& kv, std::span<const int32_t> prompt, int chunk,
                           ThreadPool* pool, std::vector<float>* hidden, bool logits) {
  SPECDEC_CHECK(kv.size() == 0, "prefill needs an empty cache");
  SPECDEC_CHECK(chunk > 0, "prefill chunk must be positive");
  const int64_t n = static_cast<int64_t>(prompt.size());
  std::vector<int32_t> positions;
  std::vector<float> last_logits;
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t len = std::min<int64_t>(chunk, n - begin);
    positions.resize(len);
    for (int64_t i = 0; i < len; ++i) positions[i] = static_cast<int32_t>(begin + i);
    const bool last = begin + len == n && logits;
    const int32_t last_row = static_cast<int32_t>(len - 1);
    ForwardBatch batch;
    batch.tokens = prompt.subspan(begin, len);
    batch.positions = positions;
    if (last) batch.output_rows = {&last_row, 1};
    batch.want_hidden = last && hidden != nullptr;
    ForwardResult r = model.forward(kv, batch, pool);
    if (last) {
      last_logits.assign(r.logits.begin(), r.logits.end());
      if (hidden) hidden->assign(r.hidden.begin(), r.hidden.end());
    }
  }
  return last_logits;
}

}  // namespace specdec
