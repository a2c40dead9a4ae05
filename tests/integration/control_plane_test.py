"""The control plane off the token path (#14, item 2): under a concurrent streaming load
through the router of a dev cluster (two decode workers that prefill themselves), the
scheduler is SIGKILLed, left dead for a while and restarted on its address. Every
request must complete meanwhile (the router places from its last worker view); after
the restart the workers re-register and send snapshots, and the scheduler's prefix index
must converge to what the engines really hold. Printed: the share of requests that
completed / failed / were truncated, the outage's requests, the convergence time and
the index drift during it.

Drift is a sampled audit against the engines: for each sampled prompt the scheduler's
Place() says which decode worker it picks and how many prompt tokens that worker has
cached (the index's claim); the same prompt sent straight to that worker (Worker.Generate,
one token) says how many it really reused (num_cached_tokens, the engine's truth). The
drift of a round is the mean |claim - truth| / prompt length over its samples."""

import os
import signal
import subprocess
import time

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("grpc")
pytest.importorskip("grpc_tools.protoc")

import fault_load  # noqa: E402

KVMESH = os.environ.get("KVMESH_BIN")
SCHEDULER = os.environ.get("KVMESH_SCHEDULER_BIN")
if not KVMESH or not SCHEDULER:
    pytest.skip("KVMESH_BIN / KVMESH_SCHEDULER_BIN not set", allow_module_level=True)

BLOCK = 16
# Shared prefixes of 4 full blocks: requests on one prefix reuse its cache.
PREFIXES = [[(p * 131 + i * 17) % 900 + 20 for i in range(4 * BLOCK)] for p in range(6)]
OUTAGE_S = 6.0
CONVERGENCE_BOUND_S = 30.0  # generous: heartbeats are 200 ms apart


def prompt_fn(i):
    return PREFIXES[i % len(PREFIXES)] + [950 + i % 37, 990 + i % 5]


def _audit(grpc, spb, spb_grpc, wpb, wpb_grpc, scheduler_address, workers_by_id, samples, tag):
    """One audit round: (drift, placed) over `samples` prompts; drift None when the
    scheduler could not place them (no worker registered yet)."""
    diffs = []
    with grpc.insecure_channel(scheduler_address) as ch:
        sched = spb_grpc.SchedulerStub(ch)
        for k, prefix in enumerate(samples):
            prompt = prefix + [7]  # one token past the full blocks: all 4 may be reused
            try:
                placed = sched.Place(spb.PlaceRequest(request_id=f"audit-{tag}-{k}", model=fault_load.MODEL,
                                                      prompt_token_ids=prompt), timeout=5)
            except grpc.RpcError:
                return None, 0
            claim = placed.decode_cached_tokens
            address = workers_by_id[placed.decode_worker.worker_id]
            request = wpb.WorkerGenerateRequest(request_id=f"audit-{tag}-{k}", prompt_token_ids=prompt,
                                                prefill_locally=True)
            request.sampling.temperature = 0
            request.sampling.max_tokens = 1
            with grpc.insecure_channel(address) as wch:
                truth = None
                for r in wpb_grpc.WorkerStub(wch).Generate(request, timeout=30):
                    if truth is None:
                        truth = r.num_cached_tokens
            diffs.append(abs(claim - (truth or 0)) / len(prompt))
    return sum(diffs) / len(diffs), len(diffs)


def test_scheduler_killed_and_restarted_under_load_every_request_completes_and_the_index_converges():
    grpc, spb, spb_grpc, wpb, wpb_grpc = fault_load.stubs()
    cluster = fault_load.DevCluster("--prefill-workers", "0", "--decode-workers", "2", "--heartbeat-ms", "200",
                                    env={"KVMESH_BIN": KVMESH, "KVMESH_SCHEDULER_BIN": SCHEDULER})
    new_scheduler = None
    try:
        scheduler_address = cluster.proc("scheduler")["address"]
        workers_by_id = {cluster.proc(n)["worker_id"]: cluster.proc(n)["address"] for n in cluster.workers()}
        client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="none", max_retries=0)
        for i in range(len(PREFIXES)):  # cache every prefix somewhere
            assert fault_load.one_stream(client, prompt_fn(i), 4, 60).kind == "ok"
        time.sleep(1.5)  # a heartbeat, then a refresh of the router's view (1 s)
        drift_before, _ = _audit(grpc, spb, spb_grpc, wpb, wpb_grpc, scheduler_address, workers_by_id, PREFIXES,
                                 "before")
        print(f"index drift before the kill: {drift_before:.3f}", flush=True)

        load = fault_load.StreamLoad(cluster.url, concurrency=4, prompt_fn=prompt_fn, max_tokens=8).start()
        time.sleep(2.0)
        os.kill(cluster.proc("scheduler")["pid"], signal.SIGKILL)
        t_kill = time.monotonic()
        time.sleep(OUTAGE_S)
        log = open(os.path.join(cluster.run_dir, "scheduler-restarted.log"), "w")
        new_scheduler = subprocess.Popen([SCHEDULER, f"--listen={scheduler_address}", "--heartbeat_interval_ms=200",
                                          "--disaggregation_threshold_tokens=0"],
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        t_restart = time.monotonic()

        # Convergence: every worker registered again and an audit round with zero drift.
        drifts = []
        converged_at = None
        round_no = 0
        while time.monotonic() - t_restart < CONVERGENCE_BOUND_S:
            assert new_scheduler.poll() is None, cluster.logs()
            round_no += 1
            try:
                with grpc.insecure_channel(scheduler_address) as ch:
                    listed = spb_grpc.SchedulerStub(ch).ListWorkers(spb.ListWorkersRequest(), timeout=2).workers
            except grpc.RpcError:
                listed = []
            samples = [PREFIXES[(round_no + k) % len(PREFIXES)] for k in range(3)]
            drift, n = _audit(grpc, spb, spb_grpc, wpb, wpb_grpc, scheduler_address, workers_by_id, samples,
                              f"r{round_no}")
            t = time.monotonic() - t_restart
            drifts.append((round(t, 2), len(listed), None if drift is None else round(drift, 3)))
            if len(listed) == len(workers_by_id) and drift == 0.0:
                converged_at = t
                break
            time.sleep(0.2)
        time.sleep(1.0)
        hung = load.stop()
        outcomes = load.outcomes
        during = [o for o in outcomes if o.end >= t_kill and o.start <= t_restart]
        kinds = fault_load.summarize(outcomes, "all requests")
        fault_load.summarize(during, f"requests overlapping the {OUTAGE_S:.0f} s scheduler outage")
        worst = max((d for _, _, d in drifts if d is not None), default=float("nan"))
        print(f"index convergence after the scheduler restart: {converged_at} s "
              f"(bound {CONVERGENCE_BOUND_S:.0f} s, ratio {(converged_at or CONVERGENCE_BOUND_S) / CONVERGENCE_BOUND_S:.3f}); "
              f"worst sampled drift during it {worst}; rounds (t_s, workers, drift): {drifts}", flush=True)
        with open(os.path.join(cluster.run_dir, "router.log"), errors="replace") as f:
            router_log = f.read()
        errors = [o.error for o in outcomes if o.kind != "ok"][:5]
        assert not hung, "load threads hung"
        assert len(during) > 0
        assert kinds.get("ok", 0) == len(outcomes), f"{kinds}: {errors}\n{cluster.logs()}"
        assert "cannot refresh the worker view" in router_log  # the router did see the outage
        assert converged_at is not None, f"the index did not converge: {drifts}\n{cluster.logs()}"
        # Nothing stranded: once idle, no KV block is in use on either worker.
        deadline = time.time() + 20
        used = None
        while time.time() < deadline:
            used = [fault_load.metric(cluster.proc(n)["metrics_url"], "kvmesh_kv_blocks", '{state="used"}')
                    for n in cluster.workers()]
            if not any(used):
                break
            time.sleep(0.2)
        print(f"KV blocks in use afterwards per worker: {used}", flush=True)
        assert not any(used), used
    finally:
        cluster.stop()
        if new_scheduler is not None:
            new_scheduler.send_signal(signal.SIGTERM)
            try:
                new_scheduler.wait(timeout=30)
            except subprocess.TimeoutExpired:
                new_scheduler.kill()
