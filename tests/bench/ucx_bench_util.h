// What the UCX bandwidth benches (kv_transport_bench, kv_store_bandwidth_bench) share: the
// machine's CPU and ISA for the report, two network namespaces joined by a veth pair
// (tcp between them, root only), and `ucx_perftest` between two processes as the bound
// at a message size.
//
// Thread-safety: run from the bench's main thread.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"

namespace kvmesh::bench {

// A namespace `ns` holding `veth_ns` (address ns_ip), its peer `veth_root` (root_ip) in
// the root namespace.
struct VethNetns {
  const char* ns;
  const char* veth_root;
  const char* veth_ns;
  const char* root_ip;
  const char* ns_ip;
};

inline int Sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

inline void DropNetns(const VethNetns& n) {
  Sh(std::string("ip netns del ") + n.ns);
  Sh(std::string("ip link del ") + n.veth_root);
}

// Sets the pair up; "" when it is, else why not (then nothing is left behind).
inline std::string MakeNetns(const VethNetns& n) {
  if (geteuid() != 0) return "not root";
  DropNetns(n);
  const std::string ns = n.ns;
  const std::vector<std::string> steps = {
      "ip netns add " + ns,
      std::string("ip link add ") + n.veth_root + " type veth peer name " + n.veth_ns,
      std::string("ip link set ") + n.veth_ns + " netns " + ns,
      std::string("ip addr add ") + n.root_ip + "/24 dev " + n.veth_root,
      std::string("ip link set ") + n.veth_root + " up",
      "ip netns exec " + ns + " ip addr add " + n.ns_ip + "/24 dev " + n.veth_ns,
      "ip netns exec " + ns + " ip link set " + n.veth_ns + " up",
      "ip netns exec " + ns + " ip link set lo up",
  };
  for (const std::string& step : steps) {
    if (Sh(step) != 0) {
      DropNetns(n);
      return "'" + step + "' failed";
    }
  }
  return "";
}

inline std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

inline const char* CpuIsa() {
  return __builtin_cpu_supports("avx512f") ? "AVX-512" : __builtin_cpu_supports("avx2") ? "AVX2" : "baseline";
}

inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// `ucx_perftest -t test` between a server (in the namespace when `netns` is given, else
// on this host) and a client here, UCX_TLS=tls, `bytes` per message; GB/s (1e9), 0 when
// it did not run.
inline double UcxPerftestGbps(const std::string& perftest, const std::string& tls, const VethNetns* netns,
                              const std::string& test, int64_t bytes, int iters, int port) {
  std::string server_env = "UCX_TLS=" + tls;
  std::string client_env = server_env;
  std::string server_prefix;
  std::string host = "127.0.0.1";
  if (netns != nullptr) {
    server_env += std::string(" UCX_NET_DEVICES=") + netns->veth_ns;
    client_env += std::string(" UCX_NET_DEVICES=") + netns->veth_root;
    server_prefix = std::string("ip netns exec ") + netns->ns + " env ";
    host = netns->ns_ip;
  }
  const std::string server =
      server_prefix + server_env + " " + perftest + " -p " + std::to_string(port) + " >/dev/null 2>&1 &";
  if (std::system(server.c_str()) != 0) return 0;
  usleep(500 * 1000);
  const std::string client = client_env + " " + perftest + " " + host + " -p " + std::to_string(port) + " -t " + test +
                             " -s " + std::to_string(bytes) + " -n " + std::to_string(iters) + " -w " +
                             std::to_string(std::max(2, iters / 10)) + " -f -v 2>/dev/null";
  FILE* f = popen(client.c_str(), "r");
  if (f == nullptr) return 0;
  char line[512];
  double mbps = 0;
  while (fgets(line, sizeof(line), f) != nullptr) {
    std::vector<std::string> cols = absl::StrSplit(line, ',');
    // iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr
    if (cols.size() >= 6 && !cols[0].empty() && cols[0].find("iterations") == std::string::npos) {
      mbps = std::atof(cols[5].c_str());
    }
  }
  pclose(f);
  return mbps * 1024.0 * 1024.0 / 1e9;  // ucx_perftest's MB is 2^20 bytes
}

}  // namespace kvmesh::bench
