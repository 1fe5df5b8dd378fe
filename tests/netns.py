"""Hosts as network namespaces on one machine, joined by a bridge.

Each host is a namespace with one veth pair into a private bridge on 198.18.N.0/24 (a
benchmarking range; nothing connects the bridge to a real interface, so no packet leaves the
machine). The bridge itself holds .1, so the test process can reach every host. A host is
partitioned from everyone with its link down, or from one peer with a blackhole route.
Names carry a random tag, so a crashed run cannot break the next; everything is deleted on exit.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from dataclasses import dataclass, field


def can_create_namespaces() -> str | None:
    """None when namespaces can be built here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if subprocess.run(["ip", "-V"], capture_output=True).returncode != 0:
        return "the ip command (iproute2) is missing"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@dataclass
class Host:
    name: str  # the namespace
    address: str
    veth: str  # this host's end, inside its namespace

    def exec(self, cmd: list[str]) -> list[str]:
        """``cmd`` run on this host (``ip netns exec`` execs it: the pid is the command's)."""
        return ["ip", "netns", "exec", self.name, *cmd]


@dataclass
class Network:
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    subnet: int = field(default_factory=lambda: 1 + secrets.randbelow(250))
    hosts: dict[str, Host] = field(default_factory=dict)

    @property
    def bridge(self) -> str:
        return f"ovb{self.tag}"

    @property
    def gateway(self) -> str:
        return f"198.18.{self.subnet}.1"

    def __enter__(self) -> Network:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        return self

    def add(self, role: str) -> Host:
        n = len(self.hosts) + 2
        host = Host(f"ovs-{self.tag}-{role}", f"198.18.{self.subnet}.{n}", f"vp{self.tag}{n}")
        outer = f"vo{self.tag}{n}"
        _ip("netns", "add", host.name)
        self.hosts[role] = host  # registered first, so a failure below is still cleaned up
        _ip("link", "add", outer, "type", "veth", "peer", "name", host.veth)
        _ip("link", "set", host.veth, "netns", host.name)
        _ip("link", "set", outer, "master", self.bridge)
        _ip("link", "set", outer, "up")
        _ip("netns", "exec", host.name, "ip", "addr", "add", f"{host.address}/24", "dev", host.veth)
        _ip("netns", "exec", host.name, "ip", "link", "set", host.veth, "up")
        _ip("netns", "exec", host.name, "ip", "link", "set", "lo", "up")
        return host

    def partition(self, host: Host) -> None:
        """Cut ``host`` off from everyone: its link goes down (connections time out)."""
        _ip("netns", "exec", host.name, "ip", "link", "set", host.veth, "down")

    def heal(self, host: Host) -> None:
        _ip("netns", "exec", host.name, "ip", "link", "set", host.veth, "up")

    def cut(self, host: Host, peer: Host) -> None:
        """Drop what ``host`` sends to ``peer`` (a blackhole route): a partition between the two."""
        _ip("netns", "exec", host.name, "ip", "route", "add", "blackhole", f"{peer.address}/32")

    def join(self, host: Host, peer: Host) -> None:
        _ip("netns", "exec", host.name, "ip", "route", "del", "blackhole", f"{peer.address}/32")

    def __exit__(self, *_: object) -> None:
        for host in self.hosts.values():
            subprocess.run(["ip", "netns", "del", host.name], capture_output=True)  # drops its veths
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
