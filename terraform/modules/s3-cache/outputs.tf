output "bucket_name" {
  description = "Name of the cache bucket."
  value       = aws_s3_bucket.this.id
}

output "bucket_arn" {
  description = "ARN of the cache bucket."
  value       = aws_s3_bucket.this.arn
}

output "bucket_region" {
  description = "AWS region of the cache bucket (the provider's region)."
  value       = aws_s3_bucket.this.region
}

output "prefix" {
  description = "Key prefix objcache uses inside the bucket."
  value       = var.prefix
}

output "tiers_fragment" {
  description = "This bucket as one OBJCACHE_TIERS entry: s3://<bucket>/<prefix>?region=<region>. Join fragments with ',' nearest tier first."
  value       = "s3://${aws_s3_bucket.this.id}/${var.prefix}?region=${aws_s3_bucket.this.region}"
}

output "reader_policy_arn" {
  description = "ARN of the read-only IAM policy (s3:GetObject, s3:ListBucket); attach it to fleet roles."
  value       = aws_iam_policy.reader.arn
}

output "writer_policy_arn" {
  description = "ARN of the read-write IAM policy (get, put, list, delete, abort multipart); attach it to CI roles only."
  value       = aws_iam_policy.writer.arn
}

output "reader_policy_json" {
  description = "JSON of the reader policy, for roles that take inline policies."
  value       = data.aws_iam_policy_document.reader.json
}

output "writer_policy_json" {
  description = "JSON of the writer policy, for roles that take inline policies."
  value       = data.aws_iam_policy_document.writer.json
}

output "reader_role_arn" {
  description = "ARN of the fleet reader role, or null when var.reader_role is null."
  value       = one(aws_iam_role.reader[*].arn)
}

output "reader_role_name" {
  description = "Name of the fleet reader role, or null when var.reader_role is null."
  value       = one(aws_iam_role.reader[*].name)
}

output "reader_instance_profile_name" {
  description = "Name of the EC2 instance profile of the reader role, or null when none was created."
  value       = one(aws_iam_instance_profile.reader[*].name)
}

output "writer_role_arn" {
  description = "ARN of the CI writer role (role-to-assume for aws-actions/configure-aws-credentials), or null when var.writer_role is null."
  value       = one(aws_iam_role.writer[*].arn)
}

output "writer_role_name" {
  description = "Name of the CI writer role, or null when var.writer_role is null."
  value       = one(aws_iam_role.writer[*].name)
}
