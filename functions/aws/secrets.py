"""API keys from Secrets Manager or SSM Parameter Store, read once per execution environment.

A secret or parameter holds a JSON list of keys (`["k1", "k2"]`) or a comma-separated
list (`k1,k2`; an SSM StringList is one). Messages name the secret, never a key.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ortserve.functions.aws.errors import SetupError
from ortserve.functions.aws.settings import LambdaSettings

if TYPE_CHECKING:
    from mypy_boto3_secretsmanager import SecretsManagerClient
    from mypy_boto3_ssm import SSMClient

T = TypeVar("T")


def parse_keys(text: str, where: str) -> list[str]:
    """The keys in a secret's text: a JSON list of strings, or a comma-separated list.

    Raises:
        SetupError: The text is JSON but not a list of strings, or it holds no key.
    """
    stripped = text.strip()
    if stripped.startswith(("[", "{", '"')):
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError:
            raise SetupError(f"{where} is not valid JSON") from None
        if isinstance(data, str):
            data = [data]
        if not isinstance(data, list) or not all(isinstance(k, str) for k in data):
            raise SetupError(f"{where} must hold a JSON list of strings or a comma-separated list")
        keys = [k.strip() for k in data]
    else:
        keys = [k.strip() for k in stripped.split(",")]
    keys = [k for k in keys if k]
    if not keys:
        # An empty list would switch authentication off: refuse rather than serve openly.
        raise SetupError(f"{where} holds no API key")
    return keys


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", type(exc).__name__))
    return type(exc).__name__


def _read(where: str, read: Callable[[], T]) -> T:
    """`read()` (a boto3 call), its AWS errors said as a SetupError that names `where`."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return read()
    except (ClientError, BotoCoreError) as exc:
        raise SetupError(f"cannot read the API keys from {where}: {_error_code(exc)}") from exc


def secret_keys(secret_id: str, client: SecretsManagerClient | None = None) -> list[str]:
    """The API keys in a Secrets Manager secret's SecretString.

    Raises:
        SetupError: The secret cannot be read or holds no keys.
    """
    where = f"Secrets Manager secret {secret_id}"

    def read() -> str | None:
        import boto3

        sm = client or boto3.client("secretsmanager")
        return sm.get_secret_value(SecretId=secret_id).get("SecretString")

    text = _read(where, read)
    if text is None:
        raise SetupError(f"{where} has no SecretString (binary secrets are not supported)")
    return parse_keys(text, where)


def parameter_keys(name: str, client: SSMClient | None = None) -> list[str]:
    """The API keys in an SSM parameter (a SecureString is decrypted).

    Raises:
        SetupError: The parameter cannot be read or holds no keys.
    """
    where = f"SSM parameter {name}"

    def read() -> str:
        import boto3

        ssm = client or boto3.client("ssm")
        return ssm.get_parameter(Name=name, WithDecryption=True)["Parameter"].get("Value", "")

    return parse_keys(_read(where, read), where)


def resolve_api_keys(settings: LambdaSettings) -> list[str]:
    """`settings.api_keys` plus the keys of the configured secret and parameter, in order.

    boto3 is imported only when a secret or parameter is configured.

    Raises:
        SetupError: A configured secret or parameter cannot be read or holds no keys.
    """
    keys = list(settings.api_keys)
    if settings.api_keys_secret_id:
        keys += secret_keys(settings.api_keys_secret_id)
    if settings.api_keys_ssm_parameter:
        keys += parameter_keys(settings.api_keys_ssm_parameter)
    return list(dict.fromkeys(keys))
