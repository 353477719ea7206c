"""deploy/prometheus/: the sample scrape config points at the service's /metrics, and every
metric its alert rules name is one a real scrape of the app serves (a renamed series would
otherwise leave an alert that never fires)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.core.config import Settings
from service.main import create_app

PROMETHEUS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


def test_the_scrape_config_reads_the_services_metrics_and_loads_its_rules():
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics" and job["static_configs"][0]["targets"]
    for rule_file in config["rule_files"]:
        assert (PROMETHEUS / rule_file).is_file(), rule_file


def test_every_metric_the_rules_name_is_served(tmp_path):
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'metrics.db'}", run_scheduler=False,
                        spool_dir=str(tmp_path / "spool"))
    with TestClient(create_app(settings)) as client:
        client.get("/api/sweeps")
        text = client.get("/metrics").text
    served = {sample.name for family in text_string_to_metric_families(text)
              for sample in family.samples}
    rules = yaml.safe_load((PROMETHEUS / "rules.yml").read_text())
    named = {name for group in rules["groups"] for rule in group["rules"]
             for name in re.findall(r"\bgdn_sweep_[a-z_]+", rule["expr"])}
    assert len(named) >= 5 and named <= served, sorted(named - served)
