// libFuzzer target: the chat template parser (fuzz_entries.h).
#include "fuzz/fuzz_entries.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specdec::fuzz::chat_template_one(data, size);
  return 0;
}
