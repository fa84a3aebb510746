"""Nothing leaves the process: the real edge daemon under strace, with a HOME and a TMPDIR
of its own, sends nothing past loopback and writes nothing there.

Without ORT_DISABLE_TELEMETRY=1, onnxruntime (1.32 here, with onnxruntime-genai 0.18)
resolves mobile.events.data.microsoft.com about 8 s after the model is ready and keeps a
telemetry cache ($HOME/.cache/Microsoft/DeveloperTools/.onnxruntime/*.db and deviceid,
$TMPDIR/.ses; <hash>.db, .db-wal and .db.ses in $TMPDIR where HOME is not writable). The
daemon turns it off itself (core.settings.disable_telemetry): the environment here does
not, so this test fails if the process stops doing it.
"""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from benchmarks.support.servers import ORTSERVE, free_port, serve_process
from tests.functional.harness import AUTH, SERVER_ENV
from tests.tools import tool

# The calls by which data leaves a process; -yy names each socket's addresses too.
TRACED = "connect,sendto,sendmsg,sendmmsg,bind"
# onnxruntime's telemetry fired about 8 s after ready (issue 26): wait past it.
AFTER_READY_S = 12.0
DNS_PORT = 53
# Local name services a resolver asks over a unix socket (systemd-resolved, nscd).
RESOLVER_SOCKETS = ("/run/systemd/resolve/", "/run/nscd/", "/var/run/nscd/")
_SOCKADDR = re.compile(r"\{sa_family=(AF_\w+)(.*?)\}")
_ENDPOINTS = re.compile(r"<(?:TCP|UDP)(?:v6)?:\[(.+?)\]>")  # -yy: [local->peer] or [inode]


def _loopback(host: str) -> bool:
    try:
        ip = ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _why_outside(family: str, fields: str) -> str | None:
    """Why a sockaddr strace printed reaches past loopback, or None if it does not."""
    if family in ("AF_UNSPEC", "AF_NETLINK"):  # a UDP disconnect; the kernel's routes
        return None
    if family == "AF_UNIX":
        path = re.search(r'sun_path=@?"([^"]*)"', fields)
        if path and path[1].startswith(RESOLVER_SOCKETS):
            return f"a name lookup through {path[1]}"
        return None
    if family in ("AF_INET", "AF_INET6"):
        port = re.search(r"port=htons\((\d+)\)", fields)
        host = re.search(r'inet_addr\("([^"]+)"\)|inet_pton\(AF_INET6, "([^"]+)"', fields)
        address = (host[1] or host[2]) if host else "?"
        if port and int(port[1]) == DNS_PORT:
            return f"a DNS query to {address}"
        return None if _loopback(address) else f"the address {address}"
    return f"the address family {family}"


def _why_endpoint(endpoint: str) -> str | None:
    host, _, port = endpoint.rpartition(":")
    if port.isdigit() and int(port) == DNS_PORT:
        return f"a DNS query to {host}"
    return None if _loopback(host) else f"the address {host}"


def outside_traffic(log: str) -> list[str]:
    """The lines of an `strace -f -yy -e trace=TRACED` log that reach past this machine's
    loopback, each with why: an IP address that is not loopback, anything to port 53 (a DNS
    query, even to a resolver on loopback), a lookup through a local resolver's socket, or
    a socket family other than unix, netlink and IP."""
    found = []
    for line in log.splitlines():
        reasons = [_why_outside(m[1], m[2]) for m in _SOCKADDR.finditer(line)]
        for sides in _ENDPOINTS.findall(line):
            if not sides.isdigit():  # an inode: not bound or connected yet
                reasons += [_why_endpoint(side) for side in sides.split("->")]
        found += [f"{why}: {line.strip()}" for why in dict.fromkeys(reasons) if why]
    return found


def _files(*roots: Path) -> list[str]:
    return sorted(str(p) for root in roots for p in root.rglob("*") if not p.is_dir())


def _strace() -> str:
    strace = tool("strace")
    probe = subprocess.run(
        [strace, "-f", "-o", os.devnull, "true"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        pytest.fail(
            "strace cannot trace a process here, so this test cannot check what leaves the "
            "daemon (ptrace not permitted? a container needs CAP_SYS_PTRACE or "
            f"--security-opt seccomp=unconfined; kernel.yama.ptrace_scope): {probe.stderr}"
        )
    return strace


def _child(pid: int) -> int:
    """The one child of `pid` (strace's tracee: the daemon)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text(encoding="ascii").split()
    assert len(children) == 1, children
    return int(children[0])


@pytest.mark.slow
def test_the_daemon_sends_nothing_past_loopback_and_writes_no_telemetry(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    strace = _strace()
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    # The whole environment: nothing inherited turns telemetry off for the daemon.
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "LANG": "C.UTF-8",
        **SERVER_ENV,
    }
    port = free_port()
    trace = tmp_path / "strace.log"
    serve = [
        *ORTSERVE,
        "serve",
        "--model-dir",
        str(tiny_model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    cmd = [strace, "-f", "-yy", "-e", f"trace={TRACED}", "-o", str(trace), *serve]
    # A group: strace blocks SIGTERM, so a stop on failure signals the daemon beside it.
    with serve_process(cmd, env, port, group=True) as server:
        ready = time.monotonic()
        with httpx.Client(base_url=server.base, headers=AUTH, timeout=60) as client:
            generate = {"prompt": "Hello", "max_new_tokens": 16}
            assert client.post("/generate", json=generate).status_code == 200
            chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16}
            assert client.post("/v1/chat/completions", json=chat).status_code == 200
            with client.stream(
                "POST", "/v1/chat/completions", json={**chat, "stream": True}
            ) as stream:
                assert stream.status_code == 200
                assert b"data: [DONE]" in b"".join(stream.iter_raw())
            assert client.get("/metrics").status_code == 200
        time.sleep(max(0.0, ready + AFTER_READY_S - time.monotonic()))
        os.kill(_child(server.proc.pid), signal.SIGTERM)
        code = server.proc.wait(timeout=45)  # strace ends with its tracee, with its status
        assert code == 0, server.stdout()[-3000:]
    log = trace.read_text(encoding="utf-8")
    assert "bind(" in log and f"htons({port})" in log  # the trace saw the daemon's sockets
    # No telemetry cache either (*.db, *.db-wal, .ses, deviceid): nothing at all there.
    leaks = outside_traffic(log) + [f"a file written: {path}" for path in _files(home, tmp)]
    assert leaks == [], "\n".join(leaks)


# -- the log check itself, on lines strace wrote for the daemon with telemetry on and off --

_TELEMETRY_ON = """\
3200  connect(16, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("10.255.255.53")}, 16) = 0
3200  sendto(16<UDP:[10.0.0.7:41234->10.255.255.53:53]>, "\\331B\\1\\0\\0\\1\\0\\0\\0\\0\\0\\0\\6mobile\\6events\\4data\\t"..., 50, MSG_NOSIGNAL, NULL, 0) = 50
3201  connect(17, {sa_family=AF_INET6, sin6_port=htons(443), sin6_flowinfo=htonl(0), inet_pton(AF_INET6, "2603:1030::1", &sin6_addr), sin6_scope_id=0}, 28) = -1 ENETUNREACH
3202  connect(5<UNIX:[991]>, {sa_family=AF_UNIX, sun_path="/run/systemd/resolve/io.systemd.Resolve"}, 42) = 0
3203  connect(6, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("127.0.0.53")}, 16) = 0
"""  # noqa: E501
_LOOPBACK_ONLY = """\
5504  bind(6<TCP:[12846]>, {sa_family=AF_INET, sin_port=htons(18732), sin_addr=inet_addr("127.0.0.1")}, 16) = 0
5504  sendto(7<TCP:[127.0.0.1:18732->127.0.0.1:45080]>, "HTTP/1.1 503 Service Unavailable"..., 190, 0, NULL, 0) = 190
5511  sendto(5<UNIX:[13370->13369]>, "\\0", 1, 0, NULL, 0) = 1
5512  sendto(3<NETLINK:[ROUTE:5512]>, [{nlmsg_len=20, nlmsg_type=RTM_GETADDR}], 20, 0, {sa_family=AF_NETLINK, nl_pid=0, nl_groups=00000000}, 12) = 20
5513  connect(8<TCPv6:[4411]>, {sa_family=AF_INET6, sin6_port=htons(8000), sin6_flowinfo=htonl(0), inet_pton(AF_INET6, "::1", &sin6_addr), sin6_scope_id=0}, 28) = 0
5513  sendto(8<TCPv6:[[::1]:40000->[::1]:8000]>, "GET /readyz"..., 11, 0, NULL, 0) = 11
5514  connect(9, {sa_family=AF_UNIX, sun_path="/run/notify"}, 13) = 0
5504  +++ exited with 0 +++
"""  # noqa: E501


def test_the_log_check_sees_dns_and_outside_addresses() -> None:
    found = outside_traffic(_TELEMETRY_ON)
    whys = [line.split(": ", 1)[0] for line in found]
    assert whys == [
        "a DNS query to 10.255.255.53",
        "the address 10.0.0.7",  # the socket's own side is off loopback
        "a DNS query to 10.255.255.53",
        "the address 2603:1030::1",
        "a name lookup through /run/systemd/resolve/io.systemd.Resolve",
        "a DNS query to 127.0.0.53",  # a resolver on loopback still forwards the query
    ], found


def test_the_log_check_lets_loopback_unix_and_netlink_through() -> None:
    assert outside_traffic(_LOOPBACK_ONLY) == []
