"""Request ids: the leaf every other module of the library may import."""

import secrets


def new_request_id() -> str:
    """A fresh random request id (24 hex digits)."""
    return secrets.token_hex(12)


__all__ = ["new_request_id"]
