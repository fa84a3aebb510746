"""template.yaml: transformed by the SAM translator and linted by cfn-lint, offline.

`sam build` adds each image function's ImageUri; the check does the same with
placeholders, transforms the template as CloudFormation's SAM transform would, and lints
both the SAM template and the CloudFormation it becomes. A broken copy must fail.
"""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path
from typing import Any

import boto3
import pytest
from cfnlint.api import lint  # type: ignore[import-untyped]  # cfn-lint ships no type hints
from cfnlint.decode.decode import decode_str  # type: ignore[import-untyped]  # same
from samtranslator.parser.parser import Parser  # type: ignore[import-untyped]  # same
from samtranslator.translator.translator import Translator  # type: ignore[import-untyped]

from ortserve.bake.package_lambda import bake_template, samconfig

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"
FUNCTIONS = ("OrtServeFunction", "OrtServeStreamFunction")
REGION = "us-east-1"


def _load(text: str) -> dict[str, Any]:
    template, errors = decode_str(text)
    assert not errors, errors
    return json.loads(json.dumps(template))  # type: ignore[no-any-return]  # plain JSON now


def transform(template: dict[str, Any], parameters: dict[str, Any] | None = None) -> Any:
    """The CloudFormation template the SAM transform makes of `template` (after sam build)."""
    built = copy.deepcopy(template)
    for name in FUNCTIONS:
        built["Resources"][name]["Properties"]["ImageUri"] = (
            f"123456789012.dkr.ecr.{REGION}.amazonaws.com/ortserve:{name}"
        )
    translator = Translator(None, Parser(), boto_session=boto3.session.Session(region_name=REGION))
    return translator.translate(built, parameters or {}, get_managed_policy_map=dict)


def problems(text: str) -> list[str]:
    """Every finding of the check: the SAM translator's, then cfn-lint's on both templates."""
    try:
        output = transform(_load(text))
    except Exception as exc:  # the translator reports invalid documents by raising
        return [f"samtranslator: {exc}"]
    found = [f"sam: {m}" for m in lint(text, regions=[REGION])]
    found += [f"cfn: {m}" for m in lint(json.dumps(output), regions=[REGION])]
    return found


@pytest.fixture(scope="module")
def text() -> str:
    return TEMPLATE.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def resources(text: str) -> dict[str, Any]:
    out: dict[str, Any] = transform(_load(text))["Resources"]
    return out


def test_the_template_is_valid(text: str) -> None:
    assert problems(text) == []


def test_it_is_valid_with_every_option_set(text: str) -> None:
    template = _load(text)
    defaults = {
        "Architecture": "x86_64",
        "MemorySize": 10240,
        "Timeout": 900,
        "EphemeralStorage": 4096,
        "ModelS3Uri": "s3://models/tiny/int4",
        "ModelSha256": "a" * 64,
        "ApiKeysSecretArn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:keys-AbCdEf",
        "ApiKeysParameterName": "/ortserve/api-keys",
        "LoadAtInit": "never",
        "EnableStreaming": "false",
        "AllowUnauthenticated": "true",
        "ReservedConcurrency": "5",
        "GenerationTimeout": 895,
    }
    for name, value in defaults.items():
        template["Parameters"][name]["Default"] = value
    assert problems(json.dumps(template)) == []


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("InvokeMode: RESPONSE_STREAM", "InvokeMode: STREAMING"),
        (
            "AuthType: NONE\n        InvokeMode: BUFFERED",
            "AuthType: OPEN\n        InvokeMode: BUFFERED",
        ),
        ("Size: !Ref EphemeralStorage", "Size: 100"),
        (
            "PackageType: Image\n      Description: ortserve, buffered",
            "PackageType: Zip\n      Description: ortserve, buffered",
        ),
    ],
)
def test_a_broken_template_fails_the_same_check(text: str, old: str, new: str) -> None:
    assert old in text
    assert problems(text.replace(old, new)) != []


def test_the_functions(resources: dict[str, Any]) -> None:
    buffered = resources["OrtServeFunction"]["Properties"]
    stream = resources["OrtServeStreamFunction"]["Properties"]
    for props in (buffered, stream):
        assert props["PackageType"] == "Image"
        assert props["Architectures"] == [{"Ref": "Architecture"}]
        assert props["MemorySize"] == {"Ref": "MemorySize"}
        assert props["EphemeralStorage"] == {"Size": {"Ref": "EphemeralStorage"}}
        assert "ORTSERVE_API_KEYS_SECRET_ID" in props["Environment"]["Variables"]
    assert buffered["Environment"]["Variables"]["ORTSERVE_LAMBDA_LOAD_AT_INIT"] == {
        "Ref": "LoadAtInit"
    }
    assert stream["Environment"]["Variables"]["AWS_LWA_INVOKE_MODE"] == "response_stream"
    assert resources["OrtServeStreamFunction"]["Condition"] == "StreamingEnabled"


def test_the_urls_and_the_http_api(resources: dict[str, Any]) -> None:
    modes = {name: resources[f"{name}Url"]["Properties"]["InvokeMode"] for name in FUNCTIONS}
    assert modes == {"OrtServeFunction": "BUFFERED", "OrtServeStreamFunction": "RESPONSE_STREAM"}
    # A public URL needs both permissions (since October 2025): SAM adds them.
    for name in FUNCTIONS:
        assert resources[f"{name}UrlPublicPermissions"]["Properties"]["FunctionUrlAuthType"] == (
            "NONE"
        )
        invoke = resources[f"{name}URLInvokeAllowPublicAccess"]["Properties"]
        assert invoke["Action"] == "lambda:InvokeFunction" and invoke["InvokedViaFunctionUrl"]
    paths = json.dumps(resources["OrtServeHttpApi"]["Properties"]["Body"]["paths"])
    assert '"/{proxy+}"' in paths and '"/"' in paths
    assert "x-amazon-apigateway-any-method" in paths


def test_the_secret_policy_is_conditional(resources: dict[str, Any]) -> None:
    policies = resources["OrtServeFunctionRole"]["Properties"]["Policies"]
    conditions = {p["Fn::If"][0]: p["Fn::If"][1] for p in policies}
    assert set(conditions) == {"HasSecret", "HasParameter", "HasModelS3"}
    statement = conditions["HasSecret"]["PolicyDocument"]["Statement"][0]
    assert statement["Action"] == "secretsmanager:GetSecretValue"
    assert statement["Resource"] == {"Ref": "ApiKeysSecretArn"}


def test_sam_build_uses_the_bake_output(text: str) -> None:
    template = _load(text)
    for name, dockerfile in zip(FUNCTIONS, ("Dockerfile", "Dockerfile.stream"), strict=True):
        metadata = template["Resources"][name]["Metadata"]
        assert metadata["DockerContext"] == "dist/lambda"
        assert metadata["Dockerfile"] == dockerfile
        assert (ROOT / "functions" / "aws" / dockerfile).is_file()  # the bake copies it there
    outputs = template["Outputs"]
    assert {"HttpApiUrl", "FunctionUrl", "StreamingFunctionUrl"} <= set(outputs)


# -- the template the bake writes: the same source, built from its own folder -----------


@pytest.mark.parametrize("arch", ["x86_64", "arm64"])
def test_the_baked_template_is_the_repository_one_built_from_its_folder(
    text: str, arch: str
) -> None:
    baked = bake_template(text, arch)
    assert problems(baked) == []
    template = _load(baked)
    for name in FUNCTIONS:
        assert template["Resources"][name]["Metadata"]["DockerContext"] == "."
    assert template["Parameters"]["Architecture"]["Default"] == arch
    # One source: nothing else differs from the repository's template.
    changed = [(a, b) for a, b in zip(text.splitlines(), baked.splitlines(), strict=True) if a != b]
    assert {a.strip() for a, _ in changed} <= {"DockerContext: dist/lambda", "Default: arm64"}
    assert len(changed) in (2, 3)


@pytest.mark.parametrize("arch", ["x86_64", "arm64"])
def test_the_samconfig_deploys_without_questions(arch: str) -> None:
    config = tomllib.loads(samconfig(arch))
    assert config["version"] == 0.1
    assert config["default"]["global"]["parameters"]["stack_name"] == "ortserve"
    deploy = config["default"]["deploy"]["parameters"]
    assert deploy["capabilities"] == "CAPABILITY_IAM"
    assert deploy["resolve_image_repos"] is True and deploy["resolve_s3"] is True
    for command in ("build", "deploy"):
        overrides = config["default"][command]["parameters"]["parameter_overrides"]
        assert overrides == f"Architecture={arch} MemorySize=3008"


def _evaluate(node: Any, parameters: dict[str, str]) -> Any:
    """A CloudFormation rule condition (Fn::Or/And/Not/Equals, Ref) under `parameters`."""
    if not isinstance(node, dict):
        return node
    ((name, arg),) = node.items()
    if name == "Ref":
        return parameters[arg]
    values = [_evaluate(a, parameters) for a in arg]
    if name == "Fn::Or":
        return any(values)
    if name == "Fn::And":
        return all(values)
    if name == "Fn::Not":
        return not values[0]
    assert name == "Fn::Equals", name
    return values[0] == values[1]


def _rule_allows(template: dict[str, Any], **overrides: str) -> bool:
    parameters = {k: str(v.get("Default", "")) for k, v in template["Parameters"].items()}
    parameters.update(overrides)
    return all(
        _evaluate(assertion["Assert"], parameters)
        for rule in template["Rules"].values()
        for assertion in rule["Assertions"]
    )


def test_a_deployment_without_api_keys_is_refused_unless_it_opts_out(text: str) -> None:
    template = _load(text)
    arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:keys-AbCdEf"
    assert not _rule_allows(template)  # the defaults: no key source, no opt-out
    assert _rule_allows(template, ApiKeysSecretArn=arn)
    assert _rule_allows(template, ApiKeysParameterName="/ortserve/api-keys")
    assert _rule_allows(template, AllowUnauthenticated="true")
    assert not _rule_allows(template, AllowUnauthenticated="false")
    # ...and the function refuses too (functions.aws.coldstart), told by the parameter.
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    assert variables["ORTSERVE_ALLOW_UNAUTHENTICATED"] == {"Ref": "AllowUnauthenticated"}


def test_reserved_concurrency_bounds_each_function_when_set(
    text: str, resources: dict[str, Any]
) -> None:
    template = _load(text)
    assert template["Parameters"]["ReservedConcurrency"]["Default"] == ""
    assert template["Conditions"]["HasReservedConcurrency"] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "ReservedConcurrency"}, ""]}]
    }
    for name in FUNCTIONS:
        assert resources[name]["Properties"]["ReservedConcurrentExecutions"] == {
            "Fn::If": [
                "HasReservedConcurrency",
                {"Ref": "ReservedConcurrency"},
                {"Ref": "AWS::NoValue"},
            ]
        }


def test_the_time_limits_agree(text: str, resources: dict[str, Any]) -> None:
    """A generation ends with a readable error before Lambda or API Gateway cut it off."""
    parameters = _load(text)["Parameters"]
    timeout, generation = parameters["Timeout"], parameters["GenerationTimeout"]
    assert generation["Default"] + 5 <= timeout["Default"]
    assert generation["MaxValue"] + 5 <= timeout["MaxValue"]
    for name in FUNCTIONS:
        props = resources[name]["Properties"]
        assert props["Timeout"] == {"Ref": "Timeout"}
        variables = props["Environment"]["Variables"]
        assert variables["ORTSERVE_REQUEST_TIMEOUT_S"] == {"Ref": "GenerationTimeout"}
    # The HTTP API's integration limit is the one the buffered handler assumes.
    body = resources["OrtServeHttpApi"]["Properties"]["Body"]["paths"]
    limits = {
        m["x-amazon-apigateway-integration"]["timeoutInMillis"]
        for path in body.values()
        for m in path.values()
    }
    from ortserve.functions.aws.settings import LambdaSettings

    assert limits == {int(LambdaSettings().lambda_api_gateway_timeout_s * 1000)}


def test_the_token_limit_is_the_settings_one(text: str) -> None:
    """MaxNewTokens' default is the server's (0: the model's context) and its bounds are
    ones the setting takes, so a deployment with the defaults takes max_tokens 2000."""
    from ortserve.core.settings import EngineSettings

    parameter = _load(text)["Parameters"]["MaxNewTokens"]
    assert parameter["Default"] == EngineSettings.model_fields["max_new_tokens"].default == 0
    for bound in (parameter["MinValue"], parameter["MaxValue"]):
        assert EngineSettings(max_new_tokens=bound).max_new_tokens == bound


def test_the_http_api_writes_an_access_log(text: str, resources: dict[str, Any]) -> None:
    """Every HTTP API request leaves one JSON line in a log group that expires (#26 item 6,
    checkov CKV_AWS_95): set on the API in the SAM template, and on the stage it becomes."""
    template = _load(text)
    (api,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::Serverless::HttpApi"]
    assert api["Properties"]["AccessLogSettings"]["DestinationArn"]
    (stage,) = [r for r in resources.values() if r["Type"] == "AWS::ApiGatewayV2::Stage"]
    settings = stage["Properties"]["AccessLogSettings"]
    group_name, attribute = settings["DestinationArn"]["Fn::GetAtt"]
    assert attribute == "Arn"
    group = resources[group_name]
    assert group["Type"] == "AWS::Logs::LogGroup"
    assert group["Properties"]["RetentionInDays"] == {"Ref": "AccessLogRetentionDays"}
    assert (
        template["Parameters"]["AccessLogRetentionDays"]["Default"]
        in (template["Parameters"]["AccessLogRetentionDays"]["AllowedValues"])
    )
    record = json.loads(settings["Format"])  # JSON lines, one object per request
    assert {"requestId", "status", "routeKey", "integrationError"} <= set(record)
    assert all(v.startswith("$context.") for v in record.values())
    # Nothing a client sent as content: no body, no header (the API key is one).
    assert not any(word in settings["Format"] for word in ("$input", "header", "authorizer"))
    # Both functions' routes are on this API: every request is logged.
    for event in template["Resources"]["OrtServeFunction"]["Properties"]["Events"].values():
        assert event["Properties"]["ApiId"] == {"Ref": "OrtServeHttpApi"}
