// libFuzzer target: the tokenizers (fuzz_entries.h).
#include "fuzz/fuzz_entries.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specdec::fuzz::tokenizer_one(data, size);
  return 0;
}
