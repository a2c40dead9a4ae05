// The kvmesh subcommands. Each parses its own flags from argv (argv[0] is the
// subcommand's name) and returns the process exit code.
#pragma once

namespace kvmesh::cli {

int RunServe(int argc, char** argv);
int RunGenerate(int argc, char** argv);
int RunTokenize(int argc, char** argv);
int RunBench(int argc, char** argv);
int RunBenchThroughput(int argc, char** argv);
int RunBenchMultiTurn(int argc, char** argv);
int RunWorker(int argc, char** argv);
int RunRouter(int argc, char** argv);
int RunKvStore(int argc, char** argv);

}  // namespace kvmesh::cli
