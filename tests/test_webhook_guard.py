"""Webhook signing (the Standard Webhooks spec's vector, one signature per rotating secret),
retry timing, and the SSRF guard with its host:port allowlist, as pure functions. Delivery
through a real worker and receiver: test_webhooks.py.
"""

from __future__ import annotations

import ipaddress
import time

import pytest
from pydantic import ValidationError

from tests.fixtures_api import (
    TenantKeys,
    verify_signature,
)
from workers.core import retry_after_s
from workers.delivery import (
    Allowlist,
    UrlRefused,
    WebhookSettings,
    check_url,
    forbidden_reason,
    sign,
    signature_header,
)

EMBED = {"model": "all-MiniLM-L6-v2", "input": "webhook me"}

# ---------------------------------------------------------------------------- pure


class TestSigning:
    def test_standard_webhooks_vector(self) -> None:
        """The example from the Standard Webhooks reference libraries."""
        secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
        got = sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, '{"test": 2432232314}')
        assert got == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

    def test_one_entry_per_secret_verifies_independently(self, tenants: TenantKeys) -> None:
        old, new = tenants.secrets["acme"]
        header = signature_header([old, new], "msg_1", int(time.time()), '{"a":1}')
        headers = {
            "webhook-id": "msg_1",
            "webhook-timestamp": str(int(time.time())),
            "webhook-signature": header,
        }
        assert len(header.split()) == 2
        assert verify_signature([old, new], headers, b'{"a":1}') == {old, new}
        assert verify_signature([old], headers, b'{"a":2}') == set()

    def test_retry_after_and_settings(self) -> None:
        assert retry_after_s("3") == 3.0
        assert retry_after_s("soon") is None
        assert retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past
        s = WebhookSettings(
            webhook_retry_schedule_s="1,2.5", webhook_allow_hosts="10.1.0.0/16:8080, hooks.internal"
        )
        assert s.webhook_retry_schedule_s == [1.0, 2.5]
        assert s.webhook_allow_hosts == ["10.1.0.0/16:8080", "hooks.internal"]
        assert WebhookSettings().webhook_retry_schedule_s == [5, 300, 1800, 7200, 18000, 36000]


class TestGuard:
    @pytest.mark.parametrize(
        "ip",
        ["127.0.0.1", "10.0.0.1", "169.254.169.254", "172.16.3.4", "192.168.1.1", "0.0.0.0", "224.0.0.1",
         "100.64.0.1", "240.0.0.1", "::1", "fe80::1", "fc00::1", "::ffff:127.0.0.1", "::ffff:169.254.169.254"],
    )  # fmt: skip
    def test_internal_addresses_refused(self, ip: str) -> None:
        assert forbidden_reason(ipaddress.ip_address(ip)) is not None

    @pytest.mark.parametrize("ip", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111"])
    def test_public_addresses_pass(self, ip: str) -> None:
        assert forbidden_reason(ipaddress.ip_address(ip)) is None

    async def test_check_url(self) -> None:
        none = Allowlist()
        for url in ["ftp://example.com/", "http://user:pw@8.8.8.8/", "http:///nohost", "file:///etc/passwd"]:
            with pytest.raises(UrlRefused):
                await check_url(url, none)
        for url in ["http://127.0.0.1:9/x", "http://10.0.0.1/", "http://169.254.169.254/latest/meta-data",
                    "https://[::1]/", "http://localhost:8000/"]:  # fmt: skip
            with pytest.raises(UrlRefused, match="refused"):
                await check_url(url, none)
        target = await check_url("http://10.0.0.1:8080/hook?x=1", Allowlist(["10.0.0.0/8:8080"]))
        assert target.connect_to() == ("http", "10.0.0.1", 8080, None) and target.url.raw_path == b"/hook?x=1"
        by_name = await check_url("https://localhost:8443/h", Allowlist(["localhost:8443"]))
        assert by_name.headers() == {"Host": "localhost:8443"}
        assert by_name.connect_to()[::3] == ("https", "localhost")  # TLS checks the name, not the address
        assert ipaddress.ip_address(by_name.ip).is_loopback  # connects to the address it checked

    @pytest.mark.parametrize(
        "ip, reaches",
        [
            ("2002:7f00:1::1", "127.0.0.1"),  # 6to4
            ("2002:a9fe:a9fe::", "169.254.169.254"),
            ("2002:a00:1::1", "10.0.0.1"),
            ("64:ff9b::7f00:1", "127.0.0.1"),  # NAT64, well-known prefix
            ("64:ff9b::a9fe:a9fe", "169.254.169.254"),
            ("64:ff9b:1::c0a8:101", "192.168.1.1"),  # NAT64, local-use prefix
            ("2001:0:4136:e378:8000:63bf:f5ff:fffe", "10.0.0.1"),  # Teredo client
            ("2001:0:a00:1:8000:63bf:f7f7:f7f7", "10.0.0.1"),  # Teredo server
            ("::ffff:10.0.0.1", "10.0.0.1"),  # IPv4-mapped
            ("::ffff:0:7f00:1", "127.0.0.1"),  # IPv4-translated
            ("::7f00:1", "127.0.0.1"),  # IPv4-compatible
            ("::a9fe:a9fe", "169.254.169.254"),
        ],
    )
    def test_ipv6_forms_embedding_an_internal_ipv4_are_refused(self, ip: str, reaches: str) -> None:
        reason = forbidden_reason(ipaddress.ip_address(ip))
        assert reason is not None and reaches in reason

    @pytest.mark.parametrize(
        "ip",
        ["2002:808:808::1", "64:ff9b::808:808", "64:ff9b:1::101:101", "2001:0:4136:e378:8000:63bf:f7f7:f7f7",
         "::ffff:8.8.8.8"],
    )  # fmt: skip
    def test_ipv6_forms_embedding_a_public_ipv4_are_judged_by_it(self, ip: str) -> None:
        """6to4 of 8.8.8.8, NAT64 of 8.8.8.8 and 1.1.1.1, Teredo via public server and client."""
        assert forbidden_reason(ipaddress.ip_address(ip)) is None

    @pytest.mark.parametrize("ip", ["fec0::1", "feff:ffff::1", "64:ff9b:1:ab::808:808"])
    def test_site_local_and_uncheckable_local_nat64_refused(self, ip: str) -> None:
        """Site-local (fec0::/10), and local-use NAT64 in a layout whose IPv4 cannot be located."""
        assert forbidden_reason(ipaddress.ip_address(ip)) is not None


class TestAllowlist:
    async def test_an_entry_admits_its_own_port_only(self) -> None:
        allow = Allowlist(["127.0.0.1:8080"])
        await check_url("http://127.0.0.1:8080/hook", allow)
        for port in (6379, 8000, 8001, 80):
            with pytest.raises(UrlRefused, match=f"port 8080 only, not {port}"):
                await check_url(f"http://127.0.0.1:{port}/", allow)

    async def test_an_entry_without_a_port_means_80_and_443(self) -> None:
        allow = Allowlist(["localhost", "10.0.0.0/8"])
        for url in ["http://localhost/h", "https://localhost/h", "http://10.1.2.3:80/", "https://10.1.2.3/"]:
            await check_url(url, allow)
        for url in ["http://localhost:6379/", "https://localhost:8443/", "http://10.1.2.3:8080/"]:
            with pytest.raises(UrlRefused, match="ports 80, 443 only"):
                await check_url(url, allow)

    async def test_cidr_and_bracketed_ipv6_entries(self) -> None:
        allow = Allowlist(["10.0.0.0/8:9000", "[::1]:8443", "[fd00::/8]:9000", "hooks.internal:443"])
        for url in ["http://10.9.8.7:9000/", "https://[::1]:8443/", "http://[fd12::1]:9000/",
                    "http://[::ffff:10.0.0.1]:9000/"]:  # fmt: skip
            await check_url(url, allow)
        for url in ["http://10.9.8.7:9001/", "https://[::1]:443/", "http://[fd12::1]/"]:
            with pytest.raises(UrlRefused, match="only, not"):
                await check_url(url, allow)

    @pytest.mark.parametrize("entry", ["127.0.0.1:", "127.0.0.1:99999", "[::1", "[::1]8080", "a b", "*"])
    def test_a_malformed_entry_stops_the_worker(self, entry: str) -> None:
        with pytest.raises(ValidationError):
            WebhookSettings(webhook_allow_hosts=entry)
