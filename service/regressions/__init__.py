"""Regressions: level shifts in the series a schedule's sweeps make (issue 25).

`report.regressions_report` (GET /api/regressions, `gdn-sweep regressions`, the /regressions
page) over `series.load_series`, with `detect.detect_shifts` (ruptures' PELT and a noise
guard); `webhook.alert_in_background`, called when a scheduled sweep finishes, POSTs the new
ones once (`alerts.py` records what was sent); `environment.environment_of_result` is the one
place a result's environment is read.
"""
