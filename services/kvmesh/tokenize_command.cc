// `kvmesh tokenize`: prints the token ids of --text (or standard input) as a JSON array.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include "absl/flags/flag.h"
#include "cli/cli_common.h"
#include "commands.h"
#include "core/file_util.h"
#include "model/tokenizer.h"

ABSL_FLAG(std::string, text, "", "Text to tokenize; standard input when empty.");
ABSL_FLAG(bool, add_special_tokens, true, "Apply the tokenizer's post-processor (e.g. add BOS).");

namespace kvmesh::cli {

int RunTokenize(int argc, char** argv) {
  ParseSubcommandFlags(argc, argv, "kvmesh tokenize [--model DIR] [--text TEXT]: print token ids as JSON",
                       {"tokenize_command"});
  std::string text = absl::GetFlag(FLAGS_text);
  if (text.empty()) text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  auto tokenizer = model::Tokenizer::FromDirectory(ModelDirFlag());
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "kvmesh tokenize: %s\n", std::string(tokenizer.status().message()).c_str());
    return 1;
  }
  const std::vector<int32_t> ids = (*tokenizer)->Encode(text, absl::GetFlag(FLAGS_add_special_tokens));
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(ids[i]);
  }
  out += "]\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace kvmesh::cli
