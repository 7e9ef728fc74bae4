#!/usr/bin/env python3
"""The ECI OpenAPI's parameter and field names, as the official Python SDK speaks them.

Writes proto/sdk/names.tsv: for every action the product uses, each request parameter exactly
as the SDK puts it on the wire, and each response field the SDK's models read, with its kind.
Nothing here lists a name by hand; all of them come out of the SDK (see requirements.txt for
the pinned versions):

- Requests: a request model is filled in completely by walking its classes' type hints (every
  optional member set, every list given one item, every nested model built), then handed to
  the SDK client's `<action>_with_options`. The HTTP transport (`DaraCore.do_action`) is
  replaced by a recorder, so what is captured is the request the SDK would have sent:
  the flattened parameters (`Container.1.EnvironmentVar.1.FieldRef.FieldPath`) and the common
  ones (`AccessKeyId`, `SignatureNonce`, ...). List indexes are written `N`.
- Common parameters: the same capture, for signature version 1.0 (the RPC scheme the SDK uses
  with `Config.signature_algorithm = 'v2'`) under each credential kind the SDK supports for it
  (AccessKey, STS token, bearer token), minus the action's own parameters.
- Responses: the response body model is filled in the same way and serialised with its
  `to_map()`; the recorder answers the client's request with that JSON, and the model the
  client parses from it must give back the same map (so `from_map` reads the names `to_map`
  writes). Paths are dotted; `X[]` is an element of the list `X`.
- Kinds come from the type hints (`string`, `int`, `float`, `bool`, `object`, `list`). A string
  parameter whose SDK documentation says it holds JSON (the SDK sends it as one string, e.g.
  `ContainerGroupIds=["eci-1"]`) is `json-array` (or `json` when the text names no array).

Usage:
    python3 proto/sdk/extract_names.py           # regenerate proto/sdk/names.tsv
    python3 proto/sdk/extract_names.py --check   # exit 1 when the checked-in table drifted
    python3 proto/sdk/extract_names.py --stdout  # print the table
"""

from __future__ import annotations

import argparse
import difflib
import importlib.metadata
import inspect
import json
import re
import sys
import typing
from pathlib import Path

HERE = Path(__file__).resolve().parent
TABLE = HERE / "names.tsv"
REQUIREMENTS = HERE / "requirements.txt"

# The actions the product calls: the only input that is not read from the SDK.
ACTIONS = [
    "CreateContainerGroup",
    "DescribeContainerGroups",
    "DescribeContainerGroupStatus",
    "DeleteContainerGroup",
    "UpdateContainerGroup",
    "RestartContainerGroup",
    "DescribeContainerLog",
    "ExecContainerCommand",
    "DescribeContainerGroupMetric",
    "DescribeMultiContainerGroupMetric",
    "CreateImageCache",
    "DescribeImageCaches",
    "UpdateImageCache",
    "DeleteImageCache",
]

# Any action serves to see the common parameters; this one has few of its own.
COMMON_PROBE_ACTION = "RestartContainerGroup"


class ExtractError(Exception):
    """The SDK is missing, not the pinned version, or did something this script cannot read."""


def pinned_versions() -> dict[str, str]:
    pins = {}
    for line in REQUIREMENTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[name.strip()] = version.strip()
    return pins


def check_installed() -> dict[str, str]:
    """The pinned packages' installed versions; an error when one is missing or different."""
    pins = pinned_versions()
    wrong = []
    for name, version in pins.items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed = None
        if installed != version:
            wrong.append(f"{name}: pinned {version}, installed {installed or 'nothing'}")
    if wrong:
        raise ExtractError(
            "the SDK is not installed as pinned ("
            + "; ".join(wrong)
            + f"): python3 -m pip install -r {REQUIREMENTS.relative_to(HERE.parent.parent)}"
        )
    return pins


def snake(action: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", action).lower()


def normalise(key: str) -> str:
    """`Container.2.Port.1.Port` → `Container.N.Port.N.Port`."""
    return ".".join("N" if part.isdigit() else part for part in key.split("."))


def member_docs(cls) -> dict[str, str]:
    """Each constructor member's documentation: the comment lines the generator writes above
    `self.member = member`."""
    docs: dict[str, str] = {}
    pending: list[str] = []
    try:
        source = inspect.getsource(cls.__init__)
    except (OSError, TypeError):
        return docs
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        assigned = re.match(r"self\.(\w+)\s*=", stripped)
        if assigned:
            docs[assigned.group(1)] = " ".join(pending)
        pending = []
    return docs


def string_kind(doc: str) -> str:
    """A string member the SDK documents as JSON travels as one JSON-encoded string: an array
    when the text says so, shows one (`["/bin/sh", "-c"]`) or counts items ("up to 20 IDs")."""
    if "JSON" not in doc:
        return "string"
    plural = "array" in doc.lower() or "[" in doc or "up to" in doc.lower()
    return "json-array" if plural else "json"


class Filler:
    """Builds fully populated models. Every scalar gets a distinct value, remembered with its
    kind, so a captured wire value names the kind of the member it came from."""

    def __init__(self, models_module, tea_model):
        self.models = models_module
        self.tea_model = tea_model
        self.kinds: dict[str, str] = {}
        self.counter = 0

    def _next(self) -> int:
        self.counter += 1
        return self.counter

    def scalar(self, hint, doc: str, where: str):
        if hint is bool:
            self.kinds["True"] = "bool"
            return True
        if hint is int:
            value = 900000 + self._next()
            self.kinds[str(value)] = "int"
            return value
        if hint is float:
            value = 800000 + self._next() + 0.5
            self.kinds[str(value)] = "float"
            return value
        if hint is str:
            value = f"s{self._next()}x"
            self.kinds[value] = string_kind(doc)
            return value
        raise ExtractError(f"{where}: no filler for type {hint!r}")

    def value(self, hint, doc: str, where: str, depth: int):
        origin = typing.get_origin(hint)
        if origin in (list, typing.List):
            (item,) = typing.get_args(hint)
            return [self.value(item, doc, where + "[]", depth)]
        if origin in (dict, typing.Dict):
            raise ExtractError(f"{where}: a map member ({hint!r}); teach this script its wire form")
        if inspect.isclass(hint) and issubclass(hint, self.tea_model):
            return self.model(hint, depth + 1)
        return self.scalar(hint, doc, where)

    def model(self, cls, depth: int = 0):
        if depth > 12:
            raise ExtractError(f"{cls.__name__}: models nest deeper than 12 levels")
        hints = typing.get_type_hints(cls.__init__, vars(self.models))
        docs = member_docs(cls)
        members = {}
        for name in inspect.signature(cls.__init__).parameters:
            if name == "self":
                continue
            if name not in hints:
                raise ExtractError(f"{cls.__name__}.{name}: no type hint")
            members[name] = self.value(
                hints[name], docs.get(name, ""), f"{cls.__name__}.{name}", depth
            )
        return cls(**members)

    def kind_of(self, value, where: str) -> str:
        if isinstance(value, bool):
            return "bool"
        key = str(value)
        if key not in self.kinds:
            raise ExtractError(f"{where}: value {value!r} was not set by this script")
        return self.kinds[key]


class Recorder:
    """Stands in for the SDK's HTTP transport: keeps the request, answers with `answer`."""

    def __init__(self):
        self.requests = []
        self.answer: dict = {}

    def do_action(self, request, runtime_option=None):
        from darabonba.response import DaraResponse

        self.requests.append(request)
        response = DaraResponse()
        response.status_code = 200
        response.status_message = "OK"
        response.headers = {"content-type": "application/json;charset=utf-8"}
        response.body = json.dumps(self.answer).encode()
        return response


def sdk():
    try:
        from alibabacloud_eci20180808 import models
        from alibabacloud_eci20180808.client import Client
        from alibabacloud_tea_openapi import models as openapi_models
        from darabonba.core import DaraCore
        from darabonba.model import DaraModel
        from darabonba.runtime import RuntimeOptions
    except ImportError as error:
        raise ExtractError(f"cannot import the SDK ({error})") from error
    return models, Client, openapi_models, DaraCore, DaraModel, RuntimeOptions


def client_for(credentials: str):
    _, Client, openapi_models, *_ = sdk()
    config = openapi_models.Config(
        endpoint="eci.cn-hangzhou.aliyuncs.com",
        region_id="cn-hangzhou",
        protocol="HTTPS",
        # Signature version 1.0 (HMAC-SHA1, parameters in the query), the RPC scheme the
        # product signs with; without it the SDK signs ACS3-HMAC-SHA256 in headers.
        signature_algorithm="v2",
    )
    if credentials == "access_key":
        config.access_key_id, config.access_key_secret = "id", "secret"
    elif credentials == "sts":
        config.access_key_id, config.access_key_secret = "id", "secret"
        config.security_token = "token"
    elif credentials == "bearer":
        config.bearer_token = "bearer"
    return Client(config)


def tea_model_base(models):
    # Generated models derive from Tea's TeaModel (alibabacloud-tea) in this SDK generation.
    from Tea.model import TeaModel

    if not issubclass(models.CreateContainerGroupRequest, TeaModel):
        raise ExtractError("the SDK's models no longer derive from Tea.model.TeaModel")
    return TeaModel


def flatten_response(value, path: str, filler: Filler, rows: dict[str, str]):
    if isinstance(value, dict):
        if path:
            rows[path] = "object"
        for key, member in value.items():
            flatten_response(member, f"{path}.{key}" if path else key, filler, rows)
    elif isinstance(value, list):
        rows[path] = "list"
        for item in value:
            flatten_response(item, path + "[]", filler, rows)
    elif value is None:
        raise ExtractError(f"{path}: left unset by the filler")
    else:
        rows[path] = filler.kind_of(value, path)


def extract() -> list[tuple[str, str, str, str]]:
    models, _, _, DaraCore, _, RuntimeOptions = sdk()
    tea_model = tea_model_base(models)
    recorder = Recorder()
    original = DaraCore.__dict__["do_action"]
    DaraCore.do_action = staticmethod(recorder.do_action)
    try:
        rows = []
        own: dict[str, set[str]] = {}
        for action in ACTIONS:
            filler = Filler(models, tea_model)
            request = filler.model(getattr(models, f"{action}Request"))
            body_cls = getattr(models, f"{action}ResponseBody")
            body = filler.model(body_cls).to_map()
            recorder.answer = body
            recorder.requests.clear()
            client = client_for("access_key")
            method = getattr(client, f"{snake(action)}_with_options")
            response = method(request, RuntimeOptions())
            if len(recorder.requests) != 1:
                raise ExtractError(f"{action}: the SDK sent {len(recorder.requests)} requests")
            sent = recorder.requests[0]
            if sent.query.get("Action") != action:
                raise ExtractError(f"{action}: the SDK sent Action={sent.query.get('Action')}")
            if sent.body:
                raise ExtractError(f"{action}: the SDK sent a body; this script reads the query")
            parsed = response.body.to_map()
            if parsed != body:
                raise ExtractError(f"{action}: the SDK's from_map does not read what to_map writes")
            params = {}
            for key, value in sent.query.items():
                if str(value) not in filler.kinds:
                    continue  # a common parameter: its own rows, below
                params[normalise(key)] = filler.kind_of(value, f"{action} {key}")
            own[action] = set(params)
            rows += [(action, "request", name, kind) for name, kind in params.items()]
            fields: dict[str, str] = {}
            flatten_response(body, "", filler, fields)
            rows += [(action, "response", name, kind) for name, kind in fields.items()]
        rows += common_rows(models, tea_model, recorder, RuntimeOptions)
        return rows
    finally:
        DaraCore.do_action = original


def common_rows(models, tea_model, recorder, runtime_options):
    """The parameters the SDK adds to every RPC request (signature version 1.0), for each
    credential kind; an action's own parameters are told apart by their filler values."""
    common: dict[str, str] = {}
    for credentials in ("access_key", "sts", "bearer"):
        filler = Filler(models, tea_model)
        request = filler.model(getattr(models, f"{COMMON_PROBE_ACTION}Request"))
        recorder.answer = filler.model(getattr(models, f"{COMMON_PROBE_ACTION}ResponseBody")).to_map()
        recorder.requests.clear()
        client = client_for(credentials)
        getattr(client, f"{snake(COMMON_PROBE_ACTION)}_with_options")(request, runtime_options())
        for key, value in recorder.requests[0].query.items():
            if str(value) not in filler.kinds:
                common[key] = "string"
    return [("*", "request", name, kind) for name, kind in common.items()]


def render(rows) -> str:
    pins = pinned_versions()
    order = {action: index for index, action in enumerate(["*"] + ACTIONS)}
    direction_order = {"request": 0, "response": 1}
    rows = sorted(set(rows), key=lambda r: (order[r[0]], direction_order[r[1]], r[2]))
    versions = ", ".join(
        f"{name}=={pins[name]}"
        for name in ("alibabacloud-eci20180808", "alibabacloud-tea-openapi", "alibabacloud-openapi-util")
    )
    lines = [
        f"# ECI OpenAPI 2018-08-08 names, extracted from the official Python SDK: {versions}",
        "# Generated by proto/sdk/extract_names.py; do not edit. Regenerate: python3 proto/sdk/extract_names.py",
        "# (check for drift: python3 proto/sdk/extract_names.py --check; install: python3 -m pip install -r proto/sdk/requirements.txt)",
        "# action '*': parameters the SDK adds to every request (signature 1.0, AccessKey/STS/bearer credentials).",
        "# request names are wire parameters, list indexes written N; response names are JSON paths, X[] an element of list X.",
        "action\tdirection\tname\tkind",
    ]
    lines += ["\t".join(row) for row in rows]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="fail when names.tsv differs")
    mode.add_argument("--stdout", action="store_true", help="print instead of writing")
    args = parser.parse_args()
    try:
        check_installed()
        table = render(extract())
    except ExtractError as error:
        print(f"extract_names: {error}", file=sys.stderr)
        return 2
    if args.stdout:
        sys.stdout.write(table)
        return 0
    if args.check:
        current = TABLE.read_text() if TABLE.exists() else ""
        if current == table:
            print(f"extract_names: {TABLE.name} matches the SDK")
            return 0
        sys.stdout.writelines(
            difflib.unified_diff(
                current.splitlines(keepends=True),
                table.splitlines(keepends=True),
                f"{TABLE.name} (checked in)",
                f"{TABLE.name} (from the SDK)",
            )
        )
        print(
            f"extract_names: {TABLE.name} differs from the SDK; regenerate with "
            "python3 proto/sdk/extract_names.py",
            file=sys.stderr,
        )
        return 1
    TABLE.write_text(table)
    print(f"extract_names: wrote {TABLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
