// `kvmesh bench multi-turn`: a chat workload whose KV working set outgrows tier 0, run
// on the same trace with the lower KV tiers off, with the host tier, and with host +
// disk, side by side in one process — TTFT, output tokens/s, where prefixes came from,
// and the tiers' measured bandwidths next to plain memcpy.
//
// Workload: --sessions chat sessions, each starting from a random history of
// --min-history .. --max-history tokens; each of --turns turns appends --turn-tokens
// user tokens, generates --output-len tokens (greedy, ignore_eos) and appends them to
// the history. At most --concurrency turns run at once; a session's next turn queues
// behind every other session's (round robin), so each session's prefix has gone cold
// in tier 0 by the time it comes back when the working set is larger than the pool.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <deque>
#include <map>
#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cli/cli_common.h"
#include "commands.h"
#include "engine/engine.h"
#include "core/flag_checks.h"
#include "core/status_macros.h"
#include "cli/engine_flags.h"
#include "kv/disk_kv_tier.h"
#include "kv/disk_read_bound.h"
#include "kv/host_copy_bound.h"

ABSL_FLAG(int, sessions, 64, "multi-turn: chat sessions.");
ABSL_FLAG(int, turns, 8, "multi-turn: turns per session.");
ABSL_FLAG(int, turn_tokens, 256, "multi-turn: user tokens each turn adds.");
ABSL_FLAG(int, min_history, 1024, "multi-turn: shortest initial history, tokens.");
ABSL_FLAG(int, max_history, 4096, "multi-turn: longest initial history, tokens.");
ABSL_FLAG(int, turn_output_len, 16, "multi-turn: generated tokens per turn.");
ABSL_FLAG(int, turn_concurrency, 8, "multi-turn: turns in flight at once.");
ABSL_FLAG(std::string, tier_modes, "off,host,host+disk",
          "multi-turn: the configurations to run, comma-separated: off, host, host+disk, host-write-through.");
ABSL_FLAG(int, multi_turn_seed, 1, "multi-turn: seed of the histories and turns.");
ABSL_FLAG(int, multi_turn_repeats, 1,
          "multi-turn: runs of every mode, interleaved (off, host, host+disk, off, ...); the summary quotes medians.");
KVMESH_FLAG_RANGE(sessions, 1, 1 << 20);
KVMESH_FLAG_RANGE(turns, 1, 1 << 16);
KVMESH_FLAG_RANGE(turn_tokens, 1, 1 << 24);
KVMESH_FLAG_RANGE(min_history, 1, 1 << 24);
KVMESH_FLAG_RANGE(max_history, 1, 1 << 24);
KVMESH_FLAG_RANGE(turn_output_len, 1, 1 << 24);
KVMESH_FLAG_RANGE(turn_concurrency, 1, 1 << 16);
KVMESH_FLAG_RANGE(multi_turn_seed, 0, 1 << 30);
KVMESH_FLAG_RANGE(multi_turn_repeats, 1, 1000);

namespace kvmesh::cli {
namespace {

using Clock = std::chrono::steady_clock;

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * (v.size() - 1) + 0.5))];
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "kvmesh bench multi-turn: %s\n", message.c_str());
  return 1;
}

struct Trace {
  std::vector<std::vector<int32_t>> histories;            // [session]
  std::vector<std::vector<std::vector<int32_t>>> turns;  // [session][turn] user tokens
};

struct ModeResult {
  std::string mode;
  double seconds = 0;
  int64_t output_tokens = 0;
  std::vector<double> ttft;
  engine::EngineStats stats;
  int64_t disk_data_bytes = 0;  // what the disk tier held at the end (records on disk)
  // The read bound measured on the tier's own first slab file (its records, as written),
  // GB/s; 0 when not measured.
  double own_data_bound_gbps = 0;
  // memcpy (kv/host_copy_bound.h) measured just before and just after the run, GB/s:
  // this VM's memory speed moves by 2x over minutes, so a host copy is held against the
  // bound of its own run, not one measured after every mode.
  double copy_bound_before_gbps = 0;
  double copy_bound_after_gbps = 0;
  double copy_bound_gbps() const { return (copy_bound_before_gbps + copy_bound_after_gbps) / 2; }
};

absl::StatusOr<ModeResult> RunMode(engine::LlamaModel& model, const std::string& mode, const Trace& trace,
                                   int64_t working_set_bytes, const std::string& disk_dir) {
  KVMESH_ASSIGN_OR_RETURN(EngineFromFlags built, BuildEngineFromFlags(model));
  engine::EngineOptions options = built.options;
  const int64_t pool_bytes = static_cast<int64_t>(built.runner->num_blocks()) * built.runner->kv_swap_bytes_per_block();
  if (mode == "off") {
    options.tiers = {};
  } else if (mode == "host") {
    // Room for the whole working set: nothing needs recomputing.
    if (options.tiers.host_cache_bytes == 0) options.tiers.host_cache_bytes = working_set_bytes * 5 / 4;
    options.tiers.disk_cache_dir.clear();
  } else if (mode == "host-write-through") {
    // As "host", with blocks copied down as tier 0 caches them rather than as it evicts them.
    if (options.tiers.host_cache_bytes == 0) options.tiers.host_cache_bytes = working_set_bytes * 5 / 4;
    options.tiers.disk_cache_dir.clear();
    options.tiers.write_through = true;
  } else if (mode == "host+disk") {
    // A host tier no larger than the pool, so the disk tier must hold the rest.
    if (options.tiers.host_cache_bytes == 0) options.tiers.host_cache_bytes = pool_bytes;
    if (options.tiers.disk_cache_dir.empty()) options.tiers.disk_cache_dir = disk_dir;
    options.tiers.disk_cache_bytes = std::max<int64_t>(options.tiers.disk_cache_bytes, working_set_bytes * 3 / 2);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--tier-modes: unknown mode '", mode, "'"));
  }
  KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine, engine::Engine::Create(options, *built.runner));

  const int sessions = static_cast<int>(trace.histories.size());
  const int turns = static_cast<int>(trace.turns[0].size());
  const int concurrency = std::max(1, absl::GetFlag(FLAGS_turn_concurrency));
  const int output_len = absl::GetFlag(FLAGS_turn_output_len);
  std::vector<std::vector<int32_t>> history = trace.histories;
  std::vector<int> next_turn(sessions, 0);
  std::vector<Clock::time_point> added(sessions);
  std::vector<bool> got_first(sessions, false);
  std::deque<int> ready;
  for (int s = 0; s < sessions; ++s) ready.push_back(s);
  ModeResult result;
  result.mode = mode;
  int in_flight = 0, done = 0;
  const int total = sessions * turns;
  const auto start = Clock::now();
  while (done < total) {
    while (in_flight < concurrency && !ready.empty()) {
      const int s = ready.front();
      ready.pop_front();
      const std::vector<int32_t>& user = trace.turns[s][next_turn[s]];
      history[s].insert(history[s].end(), user.begin(), user.end());
      engine::EngineRequest request;
      request.request_id = absl::StrCat(s);
      request.prompt_token_ids = history[s];
      request.sampling_params.temperature = 0.0f;
      request.sampling_params.max_tokens = output_len;
      request.sampling_params.ignore_eos = true;
      KVMESH_RETURN_IF_ERROR(engine->AddRequest(std::move(request)));
      added[s] = Clock::now();
      got_first[s] = false;
      ++in_flight;
    }
    KVMESH_ASSIGN_OR_RETURN(std::vector<engine::RequestOutput> outputs, engine->Step());
    const auto now = Clock::now();
    for (const engine::RequestOutput& out : outputs) {
      const int s = std::stoi(out.request_id);
      for (const engine::CompletionOutput& c : out.outputs) {
        if (!got_first[s] && !c.new_token_ids.empty()) {
          result.ttft.push_back(std::chrono::duration<double>(now - added[s]).count());
          got_first[s] = true;
        }
        history[s].insert(history[s].end(), c.new_token_ids.begin(), c.new_token_ids.end());
        result.output_tokens += static_cast<int64_t>(c.new_token_ids.size());
      }
      if (!out.finished) continue;
      if (!out.status.ok()) return out.status;
      --in_flight;
      ++done;
      if (++next_turn[s] < turns) ready.push_back(s);
    }
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  result.stats = engine->stats();
  if (result.stats.has_disk_tier) {
    const int64_t record_bytes = kv::DiskRecordBytes(built.runner->kv_swap_bytes_per_block());
    result.disk_data_bytes = result.stats.disk_tier_records * record_bytes;
    // NOTE: records fill the first slab's slots from the front; reading them, as the
    // fresh file of the bound is read, tells whether the tier's own data reads faster.
    const std::string slab = disk_dir + "/kv-slab-00000.dat";
    std::error_code ec;
    const auto slab_bytes = static_cast<int64_t>(std::filesystem::file_size(slab, ec));
    if (!ec && result.disk_data_bytes > 0) {
      absl::StatusOr<kv::DiskReadBound> own = kv::MeasureDiskReadBound(
          {.file_bytes = std::min(result.disk_data_bytes, slab_bytes) / record_bytes * record_bytes,
           .io_bytes = record_bytes, .queue_depth = kv::DiskKvTierOptions{}.queue_depth, .existing_file = slab});
      if (own.ok()) result.own_data_bound_gbps = own->bytes_per_second / 1e9;
    }
  }
  return result;
}

}  // namespace

int RunBenchMultiTurn(int argc, char** argv) {
  ParseSubcommandFlags(argc, argv,
                       "kvmesh bench multi-turn [--sessions N --turns T --turn-tokens K --min-history A "
                       "--max-history B --tier-modes off,host,host+disk]: a chat workload larger than the KV pool, "
                       "with and without the lower KV tiers",
                       {"bench_multi_turn_command", kEngineFlagsFile});
  auto loaded = LoadModelFromFlags(/*quiet=*/false);
  if (!loaded.ok()) return Fail(std::string(loaded.status().message()));
  engine::LlamaModel& model = *loaded->model;
  const int sessions = absl::GetFlag(FLAGS_sessions), turns = absl::GetFlag(FLAGS_turns);
  const int turn_tokens = absl::GetFlag(FLAGS_turn_tokens);
  const int min_history = absl::GetFlag(FLAGS_min_history), max_history = absl::GetFlag(FLAGS_max_history);
  if (sessions < 1 || turns < 1 || turn_tokens < 1 || min_history < 1 || max_history < min_history) {
    return Fail("need --sessions, --turns, --turn-tokens, --min-history >= 1 and --max-history >= --min-history");
  }
  std::mt19937_64 rng(absl::GetFlag(FLAGS_multi_turn_seed));
  const int32_t vocab = loaded->tokenizer->vocab_size();
  auto random_tokens = [&](int n) {
    std::vector<int32_t> v(n);
    for (int32_t& t : v) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
    return v;
  };
  Trace trace;
  int64_t max_tokens_per_session = 0, working_set_tokens = 0;
  for (int s = 0; s < sessions; ++s) {
    const int len = min_history + static_cast<int>(rng() % static_cast<uint64_t>(max_history - min_history + 1));
    trace.histories.push_back(random_tokens(len));
    trace.turns.emplace_back();
    for (int t = 0; t < turns; ++t) trace.turns.back().push_back(random_tokens(turn_tokens));
    const int64_t final_len = len + static_cast<int64_t>(turns) * (turn_tokens + absl::GetFlag(FLAGS_turn_output_len));
    max_tokens_per_session = std::max(max_tokens_per_session, final_len);
    working_set_tokens += final_len;
  }
  auto probe = BuildEngineFromFlags(model);
  if (!probe.ok()) return Fail(std::string(probe.status().message()));
  if (max_tokens_per_session > probe->options.max_model_len) {
    return Fail(absl::StrCat("a session reaches ", max_tokens_per_session, " tokens, past --max-model-len ",
                             probe->options.max_model_len));
  }
  const int64_t slot_bytes = probe->runner->kv_swap_bytes_per_block();
  const int32_t block = probe->runner->block_size_tokens();
  const int64_t working_set_bytes = (working_set_tokens + block - 1) / block * slot_bytes;
  const int64_t pool_bytes = static_cast<int64_t>(probe->runner->num_blocks()) * slot_bytes;
  probe->runner.reset();
  const std::string disk_dir = absl::StrCat(std::filesystem::temp_directory_path().string(), "/kvmesh-bench-disk-",
                                            getpid());
  std::printf("workload         %d sessions x %d turns (+%d user, %d generated tokens each), histories %d..%d tokens\n",
              sessions, turns, turn_tokens, absl::GetFlag(FLAGS_turn_output_len), min_history, max_history);
  std::printf("KV               pool %.1f MiB (%lld blocks), working set %.1f MiB = %.1fx the pool; %s\n",
              pool_bytes / 1048576.0, static_cast<long long>(pool_bytes / slot_bytes), working_set_bytes / 1048576.0,
              static_cast<double>(working_set_bytes) / pool_bytes, std::string(loaded->backend->name()).c_str());
  // Written now, copied into after every run: the bound of an offload into a host slot
  // that idled (kv/host_copy_bound.h, IdleHostCopyBound).
  const int copy_threads = loaded->backend->num_host_threads();
  kv::IdleHostCopyBound idle_copy_bound(slot_bytes);
  // One line per run; then, per mode, the medians over --multi-turn-repeats interleaved runs.
  std::vector<std::string> modes;
  for (const absl::string_view mode : absl::StrSplit(absl::GetFlag(FLAGS_tier_modes), ',')) modes.emplace_back(mode);
  std::map<std::string, std::vector<ModeResult>> runs;
  auto measure_copy_bound = [&] {
    return kv::MeasureHostCopyBound(slot_bytes, /*repeats=*/5, copy_threads).bytes_per_second / 1e9;
  };
  double copy_bound_gbps = measure_copy_bound();  // the latest: the next run's "before"
  for (int rep = 0; rep < absl::GetFlag(FLAGS_multi_turn_repeats); ++rep) {
    for (const std::string& mode : modes) {
      std::filesystem::remove_all(disk_dir);
      absl::StatusOr<ModeResult> r = RunMode(model, mode, trace, working_set_bytes, disk_dir);
      std::filesystem::remove_all(disk_dir);
      if (!r.ok()) return Fail(std::string(r.status().message()));
      r->copy_bound_before_gbps = copy_bound_gbps;
      copy_bound_gbps = measure_copy_bound();
      r->copy_bound_after_gbps = copy_bound_gbps;
      const ModeResult& m = *r;
      const engine::EngineStats& s = m.stats;
      const int64_t host_hits = s.prefix_cache_host_hit_tokens;
      std::printf(
          "%-10s TTFT p50 %8.1f ms  p90 %8.1f ms | %7.1f output tok/s | prefill %lld tokens computed | hits: "
          "tier0 %lld, host %lld tokens | host tier %.2f GB/s out, %.2f GB/s in | disk %.2f GB/s write, %.2f GB/s "
          "read, %lld records | load %lld / recompute %lld | stranded %lld | tier calls %.1f ms = %.2f%% of the run\n",
          m.mode.c_str(), 1e3 * Percentile(m.ttft, 50), 1e3 * Percentile(m.ttft, 90), m.output_tokens / m.seconds,
          static_cast<long long>(s.num_prefill_tokens),
          static_cast<long long>(s.prefix_cache_hit_tokens - host_hits), static_cast<long long>(host_hits),
          s.host_tier.write_bytes_per_second / 1e9, s.host_tier.read_bytes_per_second / 1e9,
          s.disk_tier.write_bytes_per_second / 1e9, s.disk_tier.read_bytes_per_second / 1e9,
          static_cast<long long>(s.disk_tier_records), static_cast<long long>(s.tiers.load_decisions),
          static_cast<long long>(s.tiers.recompute_decisions), static_cast<long long>(s.num_kv_blocks_stranded),
          1e3 * s.tier_call_seconds, 100 * s.tier_call_seconds / m.seconds);
      if (m.mode != "off") {
        std::printf("%-10s   host copies at %.0f%% / %.0f%% of memcpy (out / in): %.2f GB/s on %d threads just before "
                    "the run, %.2f just after\n",
                    m.mode.c_str(), 100 * s.host_tier.write_bytes_per_second / 1e9 / m.copy_bound_gbps(),
                    100 * s.host_tier.read_bytes_per_second / 1e9 / m.copy_bound_gbps(), m.copy_bound_before_gbps,
                    copy_threads, m.copy_bound_after_gbps);
      }
      if (s.has_disk_tier) {
        // Where disk hits were lost, if they were: offloads the host tier had no slot for,
        // write-throughs that waited for queue room or were dropped, reads that waited.
        std::printf("%-10s   disk detail: %lld blocks loaded for %lld waiting requests, %lld reads queued, %lld lost, "
                    "%lld gone again before use | load holds: %lld waits for room, %lld blocks cut short | %lld "
                    "write-throughs queued, %lld dropped | %lld offloads skipped (host tier full; then, on average, "
                    "%.0f slots held for loads, %.0f for disk writes, %.0f for this step's copies, of %d), %lld host "
                    "evictions\n",
                    m.mode.c_str(), static_cast<long long>(s.tiers.loads_started),
                    static_cast<long long>(s.num_waiting_for_disk), static_cast<long long>(s.tiers.reads_queued),
                    static_cast<long long>(s.tiers.reads_lost), static_cast<long long>(s.num_disk_blocks_lost),
                    static_cast<long long>(s.num_disk_loads_deferred), static_cast<long long>(s.tiers.load_blocks_cut),
                    static_cast<long long>(s.tiers.writes_queued), static_cast<long long>(s.tiers.writes_skipped),
                    static_cast<long long>(s.tiers.offload_skipped),
                    static_cast<double>(s.tiers.offload_skipped_held_slots) /
                        static_cast<double>(std::max<int64_t>(1, s.tiers.offload_skipped)),
                    static_cast<double>(s.tiers.offload_skipped_write_slots) /
                        static_cast<double>(std::max<int64_t>(1, s.tiers.offload_skipped)),
                    static_cast<double>(s.tiers.offload_skipped_copy_slots) /
                        static_cast<double>(std::max<int64_t>(1, s.tiers.offload_skipped)),
                    s.host_tier_slots, static_cast<long long>(s.host_tier.evictions));
        if (m.own_data_bound_gbps > 0) {
          std::printf("%-10s   disk tier's own data: %.2f GB/s in O_DIRECT io_uring reads of its %.1f MiB of records "
                      "(first slab file, whole records, the tier's queue depth), read after the run\n",
                      m.mode.c_str(), m.own_data_bound_gbps, m.disk_data_bytes / 1048576.0);
        }
      }
      std::fflush(stdout);
      runs[mode].push_back(std::move(r).value());
    }
  }
  const kv::HostCopyBound idle_bound = idle_copy_bound.Measure(copy_threads);
  const double idle_memcpy_gbps = idle_bound.bytes_per_second / 1e9;
  // The worker copies a step's blocks on its backend's threads (KvStorage::SwapOut): the
  // bound is memcpy on as many; the one-thread figure is printed beside it.
  const kv::HostCopyBound copy_bound = kv::MeasureHostCopyBound(slot_bytes, /*repeats=*/9, copy_threads);
  const double memcpy_gbps = copy_bound.bytes_per_second / 1e9;
  const double memcpy_one_thread_gbps =
      copy_threads > 1 ? kv::MeasureHostCopyBound(slot_bytes).bytes_per_second / 1e9 : memcpy_gbps;
  std::printf("memcpy           %.2f GB/s on %d thread%s (%.2f GB/s on one) for %lld-byte blocks between two %.0f MiB "
              "buffers (the host tier's bound, kv/host_copy_bound.h)\n",
              memcpy_gbps, copy_bound.num_threads, copy_bound.num_threads == 1 ? "" : "s", memcpy_one_thread_gbps,
              static_cast<long long>(slot_bytes), copy_bound.buffer_bytes / 1048576.0);
  std::printf("memcpy           %.2f GB/s on %d thread%s into memory last written %.0f s earlier (the runs' start): "
              "an evicted host slot has idled too, and this machine charges the first write after idling %.1fx\n",
              idle_memcpy_gbps, idle_bound.num_threads, idle_bound.num_threads == 1 ? "" : "s",
              idle_copy_bound.idle_seconds(), memcpy_gbps / std::max(1e-9, idle_memcpy_gbps));
  double disk_bound_gbps = 0, disk_best_gbps = 0;
  if (runs.contains("host+disk")) {
    // The disk tier's bound, measured now on the tier's filesystem (kv/disk_read_bound.h):
    // O_DIRECT io_uring reads of the tier's record size at its queue depth, of a file as
    // large as the data it held at the end of its run. Also `dd bs=4M iflag=direct`'s
    // figure, which earlier runs quoted.
    int64_t data_bytes = 0;
    for (const ModeResult& m : runs["host+disk"]) data_bytes = std::max(data_bytes, m.disk_data_bytes);
    data_bytes = std::max<int64_t>(data_bytes, kv::DiskRecordBytes(slot_bytes));
    const int32_t depth = kv::DiskKvTierOptions{}.queue_depth;
    absl::StatusOr<kv::DiskReadBound> bound = kv::MeasureDiskReadBound(
        {.directory = disk_dir, .file_bytes = data_bytes, .io_bytes = slot_bytes, .queue_depth = depth});
    absl::StatusOr<kv::DiskReadBound> dd = kv::MeasureDiskReadBound(
        {.directory = disk_dir, .file_bytes = data_bytes, .io_bytes = int64_t{4} << 20, .queue_depth = 1});
    std::filesystem::remove_all(disk_dir);
    if (!bound.ok()) return Fail(std::string(bound.status().message()));
    if (!dd.ok()) return Fail(std::string(dd.status().message()));
    disk_bound_gbps = bound->bytes_per_second / 1e9;
    // NOTE: on some disks (this VM's) a few large reads beat many record-sized ones: the
    // ratio is quoted against the better of the two as well, the stricter bound.
    disk_best_gbps = std::max(disk_bound_gbps, dd->bytes_per_second / 1e9);
    std::printf("disk             %.2f GB/s O_DIRECT io_uring reads of %lld bytes at queue depth %d of a %.1f MiB file "
                "(the tier's data) in %s: the disk tier's bound; %.2f GB/s in 4 MiB reads at depth 1\n",
                disk_bound_gbps, static_cast<long long>(bound->io_bytes), bound->queue_depth,
                bound->file_bytes / 1048576.0, std::filesystem::path(disk_dir).parent_path().string().c_str(),
                dd->bytes_per_second / 1e9);
  }
  struct Summary {
    double ttft_p50 = 0, ttft_p90 = 0, tokens_per_second = 0, host_out = 0, host_in = 0, disk_read = 0,
           tier_call_share = 0;
    double out_share_of_bound = 0, in_share_of_bound = 0;  // each run's against its own memcpy
  };
  auto summarize = [&](const std::vector<ModeResult>& v) {
    std::vector<double> p50, p90, tps, out, in, disk, share, out_share, in_share;
    for (const ModeResult& m : v) {
      out_share.push_back(m.stats.host_tier.write_bytes_per_second / 1e9 / std::max(1e-9, m.copy_bound_gbps()));
      in_share.push_back(m.stats.host_tier.read_bytes_per_second / 1e9 / std::max(1e-9, m.copy_bound_gbps()));
      p50.push_back(Percentile(m.ttft, 50));
      p90.push_back(Percentile(m.ttft, 90));
      tps.push_back(m.output_tokens / m.seconds);
      out.push_back(m.stats.host_tier.write_bytes_per_second / 1e9);
      in.push_back(m.stats.host_tier.read_bytes_per_second / 1e9);
      disk.push_back(m.stats.disk_tier.read_bytes_per_second / 1e9);
      share.push_back(m.stats.tier_call_seconds / m.seconds);
    }
    return Summary{Percentile(p50, 50), Percentile(p90, 50), Percentile(tps, 50),       Percentile(out, 50),
                   Percentile(in, 50),  Percentile(disk, 50), Percentile(share, 50),    Percentile(out_share, 50),
                   Percentile(in_share, 50)};
  };
  // Runs are interleaved (each repeat runs every mode once), so repeat r of a mode and
  // repeat r of "off" ran side by side: their throughput ratio cancels what the machine
  // did between repeats. The median of those paired ratios, with their range.
  auto paired_throughput = [&](const std::vector<ModeResult>& mode_runs, const std::vector<ModeResult>& off_runs) {
    std::vector<double> ratios;
    for (size_t r = 0; r < std::min(mode_runs.size(), off_runs.size()); ++r) {
      ratios.push_back((mode_runs[r].output_tokens / mode_runs[r].seconds) /
                       std::max(1e-9, off_runs[r].output_tokens / off_runs[r].seconds));
    }
    std::sort(ratios.begin(), ratios.end());
    return ratios;
  };
  const std::vector<ModeResult> off_runs = runs.contains("off") ? runs["off"] : std::vector<ModeResult>{};
  std::printf("medians of %d run(s) per mode:\n", absl::GetFlag(FLAGS_multi_turn_repeats));
  const bool have_off = runs.contains("off");
  const Summary off = have_off ? summarize(runs["off"]) : Summary{};
  for (const std::string& mode : modes) {
    if (!runs.contains(mode)) continue;
    const Summary m = summarize(runs[mode]);
    const std::vector<double> paired = paired_throughput(runs[mode], off_runs);
    runs.erase(mode);  // a mode named twice is summarized once
    std::string line = absl::StrCat(mode, std::string(mode.size() < 10 ? 10 - mode.size() : 0, ' '),
                                    " TTFT p50 ", absl::StrFormat("%.1f", 1e3 * m.ttft_p50), " ms, p90 ",
                                    absl::StrFormat("%.1f", 1e3 * m.ttft_p90), " ms, ",
                                    absl::StrFormat("%.1f", m.tokens_per_second), " output tok/s");
    if (have_off && mode != "off") {
      absl::StrAppend(&line, absl::StrFormat(" | vs off: TTFT p50 %.2fx better, p90 %.2fx better, throughput %.3fx",
                                             off.ttft_p50 / std::max(1e-9, m.ttft_p50),
                                             off.ttft_p90 / std::max(1e-9, m.ttft_p90),
                                             m.tokens_per_second / std::max(1e-9, off.tokens_per_second)));
    }
    if (have_off && mode != "off" && paired.size() > 1) {
      absl::StrAppend(&line, absl::StrFormat(" | paired throughput vs off: median %.3fx (%.3f..%.3f over %d pairs)",
                                             Percentile(paired, 50), paired.front(), paired.back(),
                                             static_cast<int>(paired.size())));
    }
    if (mode != "off") {
      absl::StrAppend(&line, absl::StrFormat(" | host copies at %.0f%% / %.0f%% of memcpy around each run (out / in;"
                                             " %.0f%% / %.0f%% of the one measured after every run)",
                                             100 * m.out_share_of_bound, 100 * m.in_share_of_bound,
                                             100 * m.host_out / memcpy_gbps, 100 * m.host_in / memcpy_gbps));
      // Host only: its tier holds the whole working set, so nearly every offload writes a
      // slot untouched since the run began; host+disk's tier (one pool) recycles its slots
      // within seconds, where the fresh bound above is the one that applies.
      if (mode == "host") {
        absl::StrAppend(&line, absl::StrFormat(" (out at %.0f%% of memcpy into idled memory)",
                                               100 * m.host_out / idle_memcpy_gbps));
      }
      absl::StrAppend(&line, absl::StrFormat(" | tier calls %.2f%% of the run", 100 * m.tier_call_share));
    }
    if (mode == "host+disk" && disk_bound_gbps > 0) {
      absl::StrAppend(&line, absl::StrFormat(" | disk reads %.2f GB/s per busy second = %.0f%% of the O_DIRECT "
                                             "io_uring bound at the tier's I/O size and depth, %.0f%% of the best "
                                             "sequential O_DIRECT read",
                                             m.disk_read, 100 * m.disk_read / disk_bound_gbps,
                                             100 * m.disk_read / disk_best_gbps));
    }
    std::printf("%s\n", line.c_str());
  }
  return 0;
}

}  // namespace kvmesh::cli
