# S3 tier for objcache: one dedicated bucket, entries under <prefix>/v1/<env>/<kind>/<shard>/<key>.
#
# The IAM split is the point of this module: CI is the only writer, the fleet only reads.
# Entries are pickles that torch loads, so write access to the bucket is code execution on
# every reader; keep the writer set small (see docs/terraform.md).

locals {
  name_prefix = coalesce(var.name_prefix, var.bucket_name)
  use_kms     = var.kms_key_arn != null

  # Everything objcache writes (entries, ENV.json, manifests) lives under the prefix.
  entries_arn = "${aws_s3_bucket.this.arn}/${var.prefix}/*"

  # KMS grants are usable only through S3 in the bucket's region.
  kms_via_service = "s3.${aws_s3_bucket.this.region}.amazonaws.com"
}

resource "aws_s3_bucket" "this" {
  #checkov:skip=CKV_AWS_144:Cross-region replication is not wanted for a cache: entries are reproducible, and multi-region fleets use one bucket per region listed nearest-first in OBJCACHE_TIERS (examples/multi-region-fleet) instead of copying every entry everywhere.
  #checkov:skip=CKV_AWS_21:Versioning is off by default on purpose (var.versioning_enabled): entries are immutable, first-writer-wins and reproducible, so old versions would only keep deleted entries billable. It can be turned on.
  #checkov:skip=CKV2_AWS_62:No consumer of S3 event notifications exists for cache entries; a notification per put on a high-churn cache would only add cost.
  #checkov:skip=CKV_AWS_145:SSE-KMS is opt-in via var.kms_key_arn. The default SSE-S3 (AES256) still encrypts at rest without the per-request KMS cost and the shared KMS request quota that a high-QPS cache would hit.
  #checkov:skip=CKV_AWS_18:Server access logging is opt-in via var.access_log_bucket: it needs a separate log bucket, and logging every GET of a cache typically costs more than the cache. Use CloudTrail data events for audits.
  bucket        = var.bucket_name
  force_destroy = var.force_destroy
  tags          = var.tags
}

# ACLs off: access is decided by IAM and the bucket policy only.
resource "aws_s3_bucket_ownership_controls" "this" {
  bucket = aws_s3_bucket.this.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_public_access_block" "this" {
  bucket = aws_s3_bucket.this.id

  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_server_side_encryption_configuration" "this" {
  bucket = aws_s3_bucket.this.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = local.use_kms ? "aws:kms" : "AES256"
      kms_master_key_id = var.kms_key_arn
    }
    # S3 Bucket Keys cut KMS requests by orders of magnitude for many small objects.
    bucket_key_enabled = local.use_kms
  }
}

resource "aws_s3_bucket_versioning" "this" {
  count  = var.versioning_enabled ? 1 : 0
  bucket = aws_s3_bucket.this.id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_logging" "this" {
  count  = var.access_log_bucket == null ? 0 : 1
  bucket = aws_s3_bucket.this.id

  target_bucket = var.access_log_bucket
  target_prefix = "s3-access/${var.bucket_name}/"
}

resource "aws_s3_bucket_lifecycle_configuration" "this" {
  bucket = aws_s3_bucket.this.id

  # Expiry counts from creation: objcache writes in create mode (first writer wins), so a
  # hot entry is not refreshed and is rebuilt and re-uploaded by CI after expiration_days.
  rule {
    id     = "expire-cache-entries"
    status = "Enabled"

    filter {
      prefix = "${var.prefix}/"
    }

    expiration {
      days = var.expiration_days
    }

    dynamic "noncurrent_version_expiration" {
      for_each = var.versioning_enabled ? [1] : []
      content {
        noncurrent_days = var.noncurrent_version_expiration_days
      }
    }
  }

  # Bucket-wide (empty filter): parts of abandoned uploads are billed wherever they are,
  # including under a prefix that is no longer configured.
  rule {
    id     = "abort-incomplete-multipart-uploads"
    status = "Enabled"

    filter {}

    abort_incomplete_multipart_upload {
      days_after_initiation = var.abort_incomplete_multipart_upload_days
    }
  }

  # Lifecycle rules that touch noncurrent versions must be applied after versioning.
  depends_on = [aws_s3_bucket_versioning.this]
}

data "aws_iam_policy_document" "bucket" {
  statement {
    sid     = "DenyInsecureTransport"
    effect  = "Deny"
    actions = ["s3:*"]
    resources = [
      aws_s3_bucket.this.arn,
      "${aws_s3_bucket.this.arn}/*",
    ]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }

  statement {
    sid     = "DenyOutdatedTLS"
    effect  = "Deny"
    actions = ["s3:*"]
    resources = [
      aws_s3_bucket.this.arn,
      "${aws_s3_bucket.this.arn}/*",
    ]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "NumericLessThan"
      variable = "s3:TlsVersion"
      values   = ["1.2"]
    }
  }
}

resource "aws_s3_bucket_policy" "this" {
  bucket = aws_s3_bucket.this.id
  policy = data.aws_iam_policy_document.bucket.json

  # A bucket policy put before the public access block exists could be judged public.
  depends_on = [aws_s3_bucket_public_access_block.this]
}

# Readers (the fleet): get entries and list the bucket, nothing else.
# s3:ListBucket is not optional: without it S3 answers 403 instead of 404 for a missing
# key, and objcache would count every miss as a permanent tier error instead of a miss.
# It is granted on the whole (dedicated) bucket, not narrowed with an s3:prefix
# condition, so that the 404 answer does not hinge on how S3 evaluates that condition
# for a GetObject; key names are hashes, not secrets.
data "aws_iam_policy_document" "reader" {
  statement {
    sid       = "ListCacheBucket"
    effect    = "Allow"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.this.arn]
  }

  statement {
    sid       = "ReadCacheEntries"
    effect    = "Allow"
    actions   = ["s3:GetObject"]
    resources = [local.entries_arn]
  }

  dynamic "statement" {
    for_each = local.use_kms ? [1] : []
    content {
      sid       = "DecryptCacheEntries"
      effect    = "Allow"
      actions   = ["kms:Decrypt"]
      resources = [var.kms_key_arn]

      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = [local.kms_via_service]
      }
    }
  }
}

# Writers (CI): create, overwrite, read, list and delete entries (objcache gc deletes by
# environment or age) and clean up their own multipart uploads.
data "aws_iam_policy_document" "writer" {
  statement {
    sid    = "ListCacheBucket"
    effect = "Allow"
    actions = [
      "s3:ListBucket",
      "s3:ListBucketMultipartUploads",
    ]
    resources = [aws_s3_bucket.this.arn]
  }

  statement {
    sid    = "WriteCacheEntries"
    effect = "Allow"
    actions = [
      "s3:GetObject",
      "s3:PutObject",
      "s3:DeleteObject",
      "s3:AbortMultipartUpload",
      "s3:ListMultipartUploadParts",
    ]
    resources = [local.entries_arn]
  }

  dynamic "statement" {
    for_each = local.use_kms ? [1] : []
    content {
      sid    = "EncryptCacheEntries"
      effect = "Allow"
      # GenerateDataKey for puts; Decrypt for gets and for completing multipart uploads.
      actions = [
        "kms:Decrypt",
        "kms:GenerateDataKey",
      ]
      resources = [var.kms_key_arn]

      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = [local.kms_via_service]
      }
    }
  }
}

resource "aws_iam_policy" "reader" {
  name        = "${local.name_prefix}-objcache-reader"
  description = "objcache readers (fleet): read-only access to s3://${var.bucket_name}/${var.prefix}"
  policy      = data.aws_iam_policy_document.reader.json
  tags        = var.tags
}

resource "aws_iam_policy" "writer" {
  name        = "${local.name_prefix}-objcache-writer"
  description = "objcache writers (CI): read, write and delete entries in s3://${var.bucket_name}/${var.prefix}"
  policy      = data.aws_iam_policy_document.writer.json
  tags        = var.tags
}

# ---------------------------------------------------------------------------------------
# Optional roles. Both are skipped (count = 0) unless the matching variable is set.

data "aws_iam_policy_document" "reader_trust" {
  count = var.reader_role == null ? 0 : 1

  dynamic "statement" {
    for_each = length(var.reader_role.trusted_services) > 0 ? [1] : []
    content {
      sid     = "TrustServices"
      effect  = "Allow"
      actions = ["sts:AssumeRole"]

      principals {
        type        = "Service"
        identifiers = var.reader_role.trusted_services
      }
    }
  }

  dynamic "statement" {
    for_each = length(var.reader_role.trusted_role_arns) > 0 ? [1] : []
    content {
      sid     = "TrustPrincipals"
      effect  = "Allow"
      actions = ["sts:AssumeRole"]

      principals {
        type        = "AWS"
        identifiers = var.reader_role.trusted_role_arns
      }
    }
  }
}

resource "aws_iam_role" "reader" {
  count = var.reader_role == null ? 0 : 1

  name               = var.reader_role.name
  description        = "objcache fleet: read-only access to s3://${var.bucket_name}/${var.prefix}"
  assume_role_policy = data.aws_iam_policy_document.reader_trust[0].json
  tags               = var.tags
}

resource "aws_iam_role_policy_attachment" "reader" {
  count = var.reader_role == null ? 0 : 1

  role       = aws_iam_role.reader[0].name
  policy_arn = aws_iam_policy.reader.arn
}

resource "aws_iam_instance_profile" "reader" {
  count = try(var.reader_role.create_instance_profile, false) ? 1 : 0

  name = var.reader_role.name
  role = aws_iam_role.reader[0].name
  tags = var.tags
}

data "aws_iam_policy_document" "writer_trust" {
  count = var.writer_role == null ? 0 : 1

  statement {
    sid     = "TrustGitHubActionsOIDC"
    effect  = "Allow"
    actions = ["sts:AssumeRoleWithWebIdentity"]

    principals {
      type        = "Federated"
      identifiers = [var.writer_role.github_oidc_provider_arn]
    }

    condition {
      test     = "StringEquals"
      variable = "token.actions.githubusercontent.com:aud"
      values   = ["sts.amazonaws.com"]
    }

    # Without a sub condition any GitHub repository could assume the role.
    condition {
      test     = "StringLike"
      variable = "token.actions.githubusercontent.com:sub"
      values   = var.writer_role.github_subjects
    }
  }
}

resource "aws_iam_role" "writer" {
  count = var.writer_role == null ? 0 : 1

  name                 = var.writer_role.name
  description          = "objcache CI writer: read, write and delete entries in s3://${var.bucket_name}/${var.prefix}"
  assume_role_policy   = data.aws_iam_policy_document.writer_trust[0].json
  max_session_duration = var.writer_role.max_session_duration
  tags                 = var.tags
}

resource "aws_iam_role_policy_attachment" "writer" {
  count = var.writer_role == null ? 0 : 1

  role       = aws_iam_role.writer[0].name
  policy_arn = aws_iam_policy.writer.arn
}
