"""Every alert in deploy/prometheus/kvmesh-rules.yaml has a promtool unit test that
expects it to fire (promtool itself checks that the expectations hold), and every metric
the dashboard and the rules query is one the sources register."""
import json
import os
import re

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_alert_has_a_firing_unit_test():
    with open(os.path.join(ROOT, "deploy/prometheus/kvmesh-rules.yaml")) as f:
        rules = yaml.safe_load(f)
    with open(os.path.join(ROOT, "deploy/prometheus/kvmesh-rules.test.yaml")) as f:
        tests = yaml.safe_load(f)
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert len(alerts) == 6, alerts
    firing = {a["alertname"] for t in tests["tests"] for a in t.get("alert_rule_test", []) if a.get("exp_alerts")}
    assert alerts <= firing, f"alerts without a firing test: {sorted(alerts - firing)}"


def _source_metric_names():
    """Every "kvmesh_..." string literal in libs/ and services/: the names the binaries
    register (a counter's _total is added by the registry, metrics/registry.h)."""
    names = set()
    for top in ("libs", "services"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if name.endswith((".cc", ".h")):
                    with open(os.path.join(dirpath, name), errors="replace") as f:
                        names |= set(re.findall(r'"(kvmesh_[a-z0-9_]+)"', f.read()))
    return names


def test_every_dashboard_and_rule_metric_is_registered_in_the_sources():
    """The static half of prometheus_scrape_test.py (which needs a running cluster): each
    kvmesh_* name a panel or rule queries is one the sources register, or is listed in
    expected-missing.txt."""
    with open(os.path.join(ROOT, "deploy/grafana/kvmesh-dashboard.json")) as f:
        dashboard = json.load(f)
    exprs = [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]
    with open(os.path.join(ROOT, "deploy/prometheus/kvmesh-rules.yaml")) as f:
        rules = yaml.safe_load(f)
    exprs += [(r.get("alert") or r["record"], r["expr"]) for g in rules["groups"] for r in g["rules"]]
    with open(os.path.join(ROOT, "deploy/prometheus/expected-missing.txt")) as f:
        missing = {line.strip() for line in f if line.strip() and not line.startswith("#")}
    registered = _source_metric_names()
    unknown = []
    for where, expr in exprs:
        # kvmesh_component is a label (the monitors' relabeling), not a metric.
        for name in set(re.findall(r"\b(kvmesh_[a-z0-9_]+)", expr)) - {"kvmesh_component"}:
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if not {name, base, re.sub(r"_total$", "", name)} & (registered | missing):
                unknown.append((where, name))
    assert not unknown, f"metrics no source registers: {unknown}"
    # The kv-store panels are there, on the store's own series.
    titles = {t for t, e in exprs if "kvmesh_kv_store_" in e}
    assert len(titles) >= 9, titles
