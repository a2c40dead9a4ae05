// kvmesh: the command-line entry point. `kvmesh <subcommand> [flags]`.
#include <cstdio>
#include <cstring>
#include <string>

#include "commands.h"

namespace {

constexpr char kUsage[] =
    "kvmesh: serve large language models with disaggregated KV-cache memory.\n"
    "\n"
    "Usage: kvmesh <command> [flags]      (kvmesh <command> --help for its flags)\n"
    "\n"
    "Commands:\n"
    "  serve      The OpenAI-compatible server (REST) with the continuous-batching engine\n"
    "  generate   Generate text from a prompt and stream it to stdout (--json: one object per token)\n"
    "  tokenize   Print the token ids of --text (or standard input) as a JSON array\n"
    "  worker     A prefill and/or decode worker of the cluster (kvmesh.v1.Worker gRPC)\n"
    "  router     The cluster's OpenAI-compatible REST front door (scheduler + workers)\n"
    "  kv-store   The cluster KV store: KV blocks in host memory every worker shares (kvmesh.v1.KvStore)\n"
    "  bench      Measure prefill and decode speed against the memory-bandwidth roofline\n"
    "             (bench throughput: the continuous-batching engine on a synthetic workload)\n"
    "\n"
    "Every command takes --model DIR (a Hugging Face model directory; default: the\n"
    "embedded tiny model), --backend cpu|reference and --threads N. Flags may be\n"
    "spelled with dashes or underscores, and KVMESH_<FLAG> environment variables\n"
    "set their defaults (KVMESH_MODEL=/models/llama).\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  // The subcommand sees argv[1..]: its own name as program name, then its flags.
  if (command == "serve") return kvmesh::cli::RunServe(argc - 1, argv + 1);
  if (command == "generate") return kvmesh::cli::RunGenerate(argc - 1, argv + 1);
  if (command == "tokenize") return kvmesh::cli::RunTokenize(argc - 1, argv + 1);
  if (command == "bench") return kvmesh::cli::RunBench(argc - 1, argv + 1);
  if (command == "worker") return kvmesh::cli::RunWorker(argc - 1, argv + 1);
  if (command == "router") return kvmesh::cli::RunRouter(argc - 1, argv + 1);
  if (command == "kv-store") return kvmesh::cli::RunKvStore(argc - 1, argv + 1);
  std::fprintf(stderr, "kvmesh: unknown command \"%s\"\n\n%s", command.c_str(), kUsage);
  return 2;
}
