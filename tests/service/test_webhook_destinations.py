"""Webhook destinations when the service serves beyond loopback (issue 37 item 2): the cloud
metadata address, a name that resolves to 127.0.0.1 and private hosts are refused at send
time, with the reason on the schedule; an allow-listed receiver is reached at the address that
was checked; a loopback-only service reaches local receivers as before."""

from __future__ import annotations

import ipaddress

import httpx
import pytest

from service.core.config import Settings
from service.core.exposure import serves_beyond_loopback
from service.regressions.destinations import DestinationRefused, WebhookPolicy, pinned_request
from service.regressions.webhook import alert_after_sweep, post_json

from .regression_nights import nightly_levels, nightly_schedule, run_nights
from .webhook_receiver import webhook_receiver

EXPOSED = WebhookPolicy(exposed=True)
FAST = {"tries": 2, "backoff_s": 0.01, "timeout_s": 5.0}


@pytest.mark.parametrize(("host", "exposed"), [
    ("127.0.0.1", False), ("localhost", False), ("::1", False), ("[::1]", False),
    ("127.0.0.2", False), ("0.0.0.0", True), ("::", True), ("10.0.0.5", True),
    ("head.cluster.internal", True)])
def test_what_serves_beyond_loopback(host, exposed):
    assert serves_beyond_loopback(host) is exposed


@pytest.mark.parametrize(("url", "why"), [
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://[fe80::1]/hook", "link-local"),
    ("http://127.0.0.1:8265/api/jobs/", "loopback"),
    ("http://[::ffff:127.0.0.1]:8265/", "loopback"),
    ("http://10.1.2.3/hook", "private"),
    ("https://192.168.0.7/hook", "private"),
    ("http://0.0.0.0:8265/", "unspecified"),
    ("http://localhost:8265/", "loopback"),  # a name: what it resolves to counts
])
def test_internal_destinations_are_refused_when_exposed(url, why):
    with pytest.raises(DestinationRefused, match=why) as refused:
        pinned_request(url, EXPOSED)
    assert "GDN_SWEEP_WEBHOOK_ALLOWED_HOSTS" in str(refused.value)


def test_a_global_destination_is_pinned_to_the_address_checked():
    target, headers, extensions = pinned_request("https://93.184.215.14:8443/hook?x=1", EXPOSED)
    assert httpx.URL(target).host == "93.184.215.14" and headers == {"Host":
                                                                     "93.184.215.14:8443"}
    assert extensions == {"sni_hostname": "93.184.215.14"}
    assert pinned_request("http://10.1.2.3/h", WebhookPolicy(exposed=False)) == (
        "http://10.1.2.3/h", {}, {})  # loopback-only: as given


@pytest.mark.timeout(30)
def test_a_name_resolving_to_loopback_is_not_posted_to_unless_allowed():
    with webhook_receiver() as hook:
        by_name = hook.url.replace("127.0.0.1", "localhost")
        error, tries = post_json(by_name, {"x": 1}, policy=EXPOSED, **FAST)
        assert tries == 1 and "resolves to" in error and "(loopback)" in error
        assert hook.posts == []
        for allowed in (("localhost",), ("127.0.0.0/8", "::1/128")):
            policy = WebhookPolicy(exposed=True, allowed=allowed)
            assert post_json(by_name, {"x": 2}, policy=policy, **FAST) == (None, 1)
    (post, _) = hook.posts
    # connected to the checked address, named as the URL names it
    assert post["headers"]["Host"] == httpx.URL(by_name).netloc.decode()
    assert post["body"] == {"x": 2}


def test_the_policy_comes_from_the_settings():
    policy = WebhookPolicy.from_settings(Settings(
        served_host="0.0.0.0", webhook_allowed_hosts="hooks.internal, 10.0.0.0/8"))
    assert policy.exposed and policy.allowed == ("hooks.internal", "10.0.0.0/8")
    assert policy._allows("other", ipaddress.ip_address("10.9.8.7"))
    assert not WebhookPolicy.from_settings(Settings()).exposed  # 127.0.0.1 by default


@pytest.mark.timeout(60)
def test_the_schedule_shows_why_the_post_was_refused(session_factory, client):
    schedule_id = nightly_schedule(session_factory,
                                   webhook_url="http://169.254.169.254/latest/meta-data/")
    sweeps = run_nights(session_factory, {
        "shifted": nightly_levels(71, 9, slowdown_from=7, factor=1.5),
        "steady": nightly_levels(72, 9)})
    assert alert_after_sweep(session_factory=session_factory, sweep_id=sweeps[-1],
                             policy=EXPOSED, **FAST) == 0
    shown = client.get(f"/api/schedules/{schedule_id}").json()
    assert shown["webhook_status"] == "failed"
    assert shown["webhook_error"].startswith("refused: the webhook's host 169.254.169.254 "
                                             "resolves to 169.254.169.254 (link-local)")
