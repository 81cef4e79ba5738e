"""Which network a server faces and what it needs there (SECURITY.md): loopback by default; a
server bound beyond loopback authenticates its peers (a token) or is allowed explicitly
(`--insecure`). The PS, Spark and DDP ask `check_exposure` (Horovod checks its host list itself).

The job's token on our PS wire comes from a file only its owner may read (`--token-file`) or from
the environment (PSBENCH_PS_TOKEN), never from a command line, which any local user can read."""
from __future__ import annotations

import argparse
import ipaddress
import os
from pathlib import Path

from psbench.core.errors import ConfigError

TOKEN_ENV = "PSBENCH_PS_TOKEN"
TOKEN_REMEDY = f"give a token (--token-file FILE or env {TOKEN_ENV}), or --insecure to accept any client"


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost; anything else (0.0.0.0, a name, *) is reachable from elsewhere."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def address_host(address: str) -> str:
    """The host of 'host:port' or 'tcp://host:port'."""
    return address.split("://", 1)[-1].rpartition(":")[0]


def split_address(text: str) -> tuple[str, int]:
    """'host:port' as (host, port); ConfigError for anything else."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"address '{text}' must be host:port, e.g. 127.0.0.1:5555")
    return host, int(port)


def check_exposure(what: str, host: str, token: str | bool | None, insecure: bool, remedy: str = TOKEN_REMEDY) -> None:
    """A server bound beyond loopback needs authentication (a token, or True: it is on), or an
    explicit opt-out (--insecure); `remedy` says how, for the system at hand."""
    if not is_loopback(host) and not token and not insecure:
        raise ConfigError(f"{what} binds {host}, which is reachable from other hosts: {remedy}")


def add_token_argument(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--token-file", metavar="FILE", help=f"{what}: read from FILE (its first line; readable by its "
                   f"owner only), else env {TOKEN_ENV}; never a command-line value, which any local user can read")
    p.add_argument("--token", help=argparse.SUPPRESS)  # caught, so that it is not taken for --token-file


def token_from_args(args: argparse.Namespace) -> str | None:
    if args.token is not None:
        raise ConfigError(f"--token takes no value on the command line, where any local user can read it (ps): "
                          f"use --token-file FILE (mode 600) or env {TOKEN_ENV}")
    return read_token(args.token_file)


def read_token(path: str | None) -> str | None:
    """The job's token: the first line of `path` (which no one but its owner may read), else env
    PSBENCH_PS_TOKEN, else None."""
    if path is None:
        return os.environ.get(TOKEN_ENV) or None
    try:
        mode = os.stat(path).st_mode
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"token file {path}: {exc.strerror}") from None
    if mode & 0o077:
        raise ConfigError(f"token file {path} is readable by other users (mode {mode & 0o777:o}): chmod 600 {path}")
    if not lines or not lines[0].strip():
        raise ConfigError(f"token file {path} is empty: its first line is the token")
    return lines[0].strip()
