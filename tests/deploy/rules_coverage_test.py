"""Every alert in deploy/prometheus/kvmesh-rules.yaml has a promtool unit test that
expects it to fire (promtool itself checks that the expectations hold)."""
import os

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
