"""Host addresses that go on an ssh, scp or horovodrun command line: a hostname or an IP address,
checked where a file or an option names them. ssh reads a destination that starts with '-' as an
option (`-oProxyCommand=...` runs a command here), so such a name must never reach its argv."""
from __future__ import annotations

import ipaddress
import re

HOST_RULE = ("a hostname (RFC 1123: labels of letters, digits and '-', none starting or ending with '-', "
             "joined by '.') or an IP address")
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\Z")


def is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def is_host_address(text: object) -> bool:
    """Whether `text` is an IP address or an RFC 1123 hostname (a trailing '.' allowed)."""
    if not isinstance(text, str) or not text:
        return False
    if is_ip(text):
        return True
    name = text[:-1] if text.endswith(".") else text
    return len(name) <= 253 and all(_LABEL.match(label) for label in name.split("."))
