/**
 * @file fuzz/fuzz_spec.cpp
 * @brief libFuzzer target: spec text through spec_from_text(), the path of gdnc's spec files and
 *        of the C ABI's gdn_spec_validate().
 *
 * The contract it checks, beyond "no crash, no hang, no sanitizer report": every refusal is a
 * SpecError (any other exception escapes and libFuzzer reports it), its message is bounded and
 * printable ASCII, and an accepted spec survives its canonical form unchanged.
 */
#include "compiler/spec.hpp"

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace {

bool short_and_printable(std::string_view message) {
  if (message.empty() || message.size() > 2048) return false;
  for (unsigned char c : message)
    if (c < 0x20 || c >= 0x7f) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const gdn::Spec spec = gdn::spec_from_text(text);
    const nlohmann::json canonical = gdn::to_json(spec);
    if (gdn::to_json(gdn::spec_from_text(canonical.dump())) != canonical) __builtin_trap();
  } catch (const gdn::SpecError& e) {
    if (!short_and_printable(e.what())) __builtin_trap();
  }
  return 0;
}
