"""The PS wire's encryption beyond loopback (psbench.core.exposure.is_loopback): ZeroMQ's CURVE
(CurveZMQ: Curve25519 key agreement, XSalsa20-Poly1305 boxes, a fresh session key per connection).

A shard bound beyond loopback with a token speaks CURVE, and so does every client that connects
to a non-loopback address with a token: the two sides decide from the address alone, so nothing
else needs to agree. CURVE encrypts and authenticates the server; the job's token stays the
authorisation (decode checks it in every message, inside the encrypted stream), so a client's
key proves nothing and each client socket makes a fresh keypair (libzmq with no ZAP handler
accepts any client key).

The server's keypair is derived from the token (HMAC-SHA256 under a fixed label): it is as per-job
as the token, travels wherever the token already travels (a 0600 file or the environment, never
a command line) and adds no second secret to hand over. So the token must be a random one (the
launchers make one with secrets.token_hex(16)); a guessable token gives a guessable key.

Loopback stays plain, as nothing leaves the machine there, unless asked (`curve=True`)."""
from __future__ import annotations

import hashlib
import hmac
from typing import Any

from psbench.core.exposure import TOKEN_ENV, is_loopback

_LABEL = b"psbench ps curve server key v1"


def wanted(host: str, token: str | None, curve: bool | None = None) -> bool:
    """CURVE on a socket bound to, or connecting to, `host`: as asked, else beyond loopback with a token."""
    if curve is None:
        return token is not None and not is_loopback(host)
    if curve and token is None:
        from psbench.core.errors import ConfigError

        raise ConfigError("CURVE needs the job's token (its server key is derived from it): give a token "
                          f"(--token-file FILE or env {TOKEN_ENV})")
    return curve


def server_keys(token: str) -> tuple[bytes, bytes]:
    """The job's CURVE server keypair (public, secret; Z85), derived from its token."""
    import zmq
    from zmq.utils import z85

    _check_available()
    secret = z85.encode(hmac.new(_LABEL, token.encode(), hashlib.sha256).digest())
    return zmq.curve_public(secret), secret


def secure_server(sock: Any, token: str) -> None:
    """Make `sock` (before it binds) a CURVE server with the job's key."""
    public, secret = server_keys(token)
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True


def secure_client(sock: Any, token: str) -> None:
    """Make `sock` (before it connects) a CURVE client of the job's servers, with a fresh keypair."""
    import zmq

    server_public, _ = server_keys(token)
    public, secret = zmq.curve_keypair()
    sock.curve_serverkey = server_public
    sock.curve_publickey = public
    sock.curve_secretkey = secret


def _check_available() -> None:
    import zmq

    if not zmq.has("curve"):
        from psbench.core.errors import ConfigError

        raise ConfigError(f"this pyzmq's libzmq {zmq.zmq_version()} has no CURVE (zmq.has('curve') is False), which "
                          f"a PS bound beyond loopback needs: install a pyzmq wheel built with libsodium")
