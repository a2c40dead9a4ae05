// Which KV peers share this host, and what UCX_TLS lets UCX use between them. A
// receiver names its host in every lease descriptor (LocalHostIdentity); a sender on the
// same host then writes runs by cross-memory attach (cma_put.h) and connects its UCX
// endpoint over shared memory, never over a network device: UCX 1.13 gives shared
// memory no peer-failure handling, so an endpoint that asks for it is put on tcp, over
// whichever interface holds an address (a veth of another tenant's pod included; one
// that vanished mid-transfer stalled the fault suite's transfers for a second).
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

namespace kvmesh::kv {

// This process's host and PID namespace ("<boot id>/<pid namespace inode>"): two
// processes can attach each other's memory, and share /dev/shm's view of a host, only
// when theirs are equal. Empty when either cannot be read.
std::string LocalHostIdentity();

// Whether a UCX_TLS value (`tls`, else the environment's UCX_TLS; empty: UCX's choice)
// lets UCX use cma: "all", "sm", "shm" or "cma" listed, or a "^" exclusion list that
// names none of them.
bool UcxTlsAllowsCma(std::string_view tls);

// Whether it lets UCX send active messages over shared memory: "all", "sm", "shm",
// "posix" or "sysv" listed, or a "^" exclusion list that leaves one of posix and sysv.
bool UcxTlsAllowsSharedMemory(std::string_view tls);

}  // namespace kvmesh::kv
