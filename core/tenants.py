"""Tenants: whose request it is. Each API key is a tenant (no keys: one tenant, ""), and
nothing one tenant sends may change what another sees: prompt-cache entries and
`cached_tokens`, stored responses and fault records are scoped to the tenant (and a
request's `cache_salt` narrows its prompt-cache scope further). What tenants share is
capacity only: slots, the queue, memory (docs/api.md, "Tenants").
"""

from __future__ import annotations

import hashlib

#: The tenant of a server with no API keys: everyone.
ANYONE = ""


def tenant_of(key: str) -> str:
    """The tenant id of API key `key`: a digest, so that the key itself is kept nowhere
    but in the settings (records and logs may name the tenant)."""
    return hashlib.sha256(b"ortserve-tenant\0" + key.encode()).hexdigest()[:16]


def cache_scope(tenant: str, cache_salt: str | None) -> str:
    """What a prompt-cache entry is scoped to: the tenant, and the request's
    `cache_salt` where it gives one (vLLM's: only requests with the same salt share)."""
    if not cache_salt:
        return tenant
    salt = hashlib.sha256(cache_salt.encode()).hexdigest()[:16]
    return f"{tenant}/{salt}"
