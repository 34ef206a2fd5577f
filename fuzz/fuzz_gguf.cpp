// libFuzzer target: the GGUF reader (fuzz_entries.h).
#include "fuzz/fuzz_entries.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specdec::fuzz::gguf_one(data, size);
  return 0;
}
