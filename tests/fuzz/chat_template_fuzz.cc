// Chat-template rendering through ChatTemplate's public API only (FromJinja / FromName /
// Apply), so the target keeps working when the renderer behind it changes: any
// template text and any messages render or give a clean error.
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "model/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvmesh::fuzz::Input in(data, size);
  const uint8_t mode = in.Take<uint8_t>();
  static const char* const kNames[] = {"llama3", "chatml", "mistral"};
  static const char* const kRoles[] = {"system", "user", "assistant", "tool", "developer"};
  absl::StatusOr<kvmesh::model::ChatTemplate> tmpl =
      (mode & 1) ? kvmesh::model::ChatTemplate::FromJinja(in.TakeLongString(8192))
                 : kvmesh::model::ChatTemplate::FromName(kNames[(mode >> 1) % 3]);
  if (!tmpl.ok()) return 0;
  const std::string bos = in.TakeString(16);
  const std::string eos = in.TakeString(16);
  std::vector<kvmesh::model::ChatMessage> messages;
  while (!in.empty() && messages.size() < 64) {
    const uint8_t r = in.Take<uint8_t>();
    std::string role = r < 250 ? kRoles[r % 5] : in.TakeString(16);  // mostly known roles
    messages.push_back({std::move(role), in.TakeString()});
  }
  (void)tmpl->Apply(messages, (mode & 8) != 0, bos, eos);
  return 0;
}
