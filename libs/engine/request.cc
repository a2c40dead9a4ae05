#include "engine/request.h"

namespace kvmesh::engine {

std::string_view CompletionFinishReasonName(CompletionFinishReason reason) {
  switch (reason) {
    case CompletionFinishReason::kNone: return "";
    case CompletionFinishReason::kStop: return "stop";
    case CompletionFinishReason::kLength: return "length";
    case CompletionFinishReason::kAbort: return "abort";
    case CompletionFinishReason::kError: return "error";
  }
  return "";
}

CompletionFinishReason ToCompletionFinishReason(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return CompletionFinishReason::kNone;
    case FinishReason::kStop: return CompletionFinishReason::kStop;
    case FinishReason::kLength: return CompletionFinishReason::kLength;
  }
  return CompletionFinishReason::kNone;
}

}  // namespace kvmesh::engine
