# A fleet spread over three AWS regions. Each region gets a bucket next to its machines;
# the home bucket is the tier of last resort. A machine in region R uses
#
#   OBJCACHE_TIERS = s3://<prefix>-R/...?region=R,s3://<prefix>-<home>/...?region=<home>
#
# nearest first: objcache asks all remote tiers concurrently and takes the first valid hit
# in this order, so a regional hit wins and the home bucket covers regional misses.
#
# Writes: CI is the only writer. Its OBJCACHE_TIERS lists every bucket, so objcache's
# write-behind uploads each new entry to all of them (output ci_tiers; attach
# writer_policy_arns to the CI role, see ../ci-preseed). The fleet role can only read.

module "home" {
  source = "../../modules/s3-cache"

  bucket_name     = "${var.bucket_name_prefix}-${var.home_region}"
  prefix          = var.prefix
  expiration_days = var.home_expiration_days
}

module "eu" {
  source = "../../modules/s3-cache"
  providers = {
    aws = aws.eu
  }

  bucket_name     = "${var.bucket_name_prefix}-${var.eu_region}"
  prefix          = var.prefix
  expiration_days = var.regional_expiration_days
}

module "apac" {
  source = "../../modules/s3-cache"
  providers = {
    aws = aws.apac
  }

  bucket_name     = "${var.bucket_name_prefix}-${var.apac_region}"
  prefix          = var.prefix
  expiration_days = var.regional_expiration_days
}

locals {
  home_tier = module.home.tiers_fragment

  # Region => that region's own bucket. Add new regional modules here.
  regional_tiers = {
    (var.eu_region)   = module.eu.tiers_fragment
    (var.apac_region) = module.apac.tiers_fragment
  }

  # Region => OBJCACHE_TIERS for machines in that region, nearest first.
  fleet_tiers = merge(
    { for region, tier in local.regional_tiers : region => join(",", [tier, local.home_tier]) },
    { (var.home_region) = local.home_tier },
  )

  # CI writes every new entry to every bucket; home first so that CI's own reads prefer it.
  ci_tiers = join(",", concat([local.home_tier], [for region in sort(keys(local.regional_tiers)) : local.regional_tiers[region]]))

  reader_policy_arns = {
    (var.home_region) = module.home.reader_policy_arn
    (var.eu_region)   = module.eu.reader_policy_arn
    (var.apac_region) = module.apac.reader_policy_arn
  }

  writer_policy_arns = {
    (var.home_region) = module.home.writer_policy_arn
    (var.eu_region)   = module.eu.writer_policy_arn
    (var.apac_region) = module.apac.writer_policy_arn
  }
}

# One global fleet role, read-only on every bucket: a machine that moves region or falls
# back to another region's bucket keeps working without a new role.
data "aws_iam_policy_document" "fleet_trust" {
  statement {
    sid     = "TrustEC2"
    effect  = "Allow"
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "fleet" {
  name               = var.fleet_role_name
  description        = "objcache fleet: read-only on the home and regional cache buckets"
  assume_role_policy = data.aws_iam_policy_document.fleet_trust.json

  lifecycle {
    precondition {
      condition     = length(distinct([var.home_region, var.eu_region, var.apac_region])) == 3
      error_message = "home_region, eu_region and apac_region must be three different regions."
    }
  }
}

resource "aws_iam_role_policy_attachment" "fleet" {
  for_each = local.reader_policy_arns

  role       = aws_iam_role.fleet.name
  policy_arn = each.value
}

resource "aws_iam_instance_profile" "fleet" {
  name = var.fleet_role_name
  role = aws_iam_role.fleet.name
}
