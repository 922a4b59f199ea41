# CI pre-seeds the cache, the fleet only reads it.
#
# A GitHub Actions workflow on a trusted branch assumes the writer role through OIDC (no
# long-lived keys), compiles the models with OBJCACHE_TIERS pointing at the bucket, and
# objcache uploads every new entry. Fleet machines run with the reader instance profile
# and OBJCACHE_READ_ONLY=1: they hit what CI seeded and can never overwrite it.

locals {
  github_oidc_url = "https://token.actions.githubusercontent.com"

  github_oidc_provider_arn = (
    var.create_github_oidc_provider
    ? aws_iam_openid_connect_provider.github[0].arn
    : data.aws_iam_openid_connect_provider.github[0].arn
  )
}

resource "aws_iam_openid_connect_provider" "github" {
  count = var.create_github_oidc_provider ? 1 : 0

  url            = local.github_oidc_url
  client_id_list = ["sts.amazonaws.com"]
  # AWS validates GitHub's tokens against its own trusted CAs and ignores these, but
  # older provider versions require the argument.
  thumbprint_list = [
    "6938fd4d98bab03faadb97b34396831e3780aea1",
    "1c58a3a8518e8759bf075b76b750d4f2df264fcd",
  ]
}

data "aws_iam_openid_connect_provider" "github" {
  count = var.create_github_oidc_provider ? 0 : 1

  url = local.github_oidc_url
}

module "cache" {
  source = "../../modules/s3-cache"

  bucket_name     = var.bucket_name
  prefix          = var.prefix
  expiration_days = var.expiration_days

  writer_role = {
    name                     = var.ci_role_name
    github_oidc_provider_arn = local.github_oidc_provider_arn
    github_subjects          = var.github_subjects
  }

  reader_role = {
    name                    = var.fleet_role_name
    trusted_services        = ["ec2.amazonaws.com"]
    create_instance_profile = true
  }
}

# Signing (docs/security.md): CI holds the Ed25519 private key and signs what it writes;
# the fleet holds only public keys, verifies every entry it reads, and writes nothing.
data "aws_iam_policy_document" "ci_signing_key" {
  count = var.signing_key_secret_arn == null ? 0 : 1

  statement {
    sid       = "ReadObjcacheSigningKey"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [var.signing_key_secret_arn]
  }
}

resource "aws_iam_role_policy" "ci_signing_key" {
  count = var.signing_key_secret_arn == null ? 0 : 1

  name   = "objcache-signing-key"
  role   = module.cache.writer_role_name
  policy = data.aws_iam_policy_document.ci_signing_key[0].json
}
