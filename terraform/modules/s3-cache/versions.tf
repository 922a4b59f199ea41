terraform {
  # optional() object attributes with defaults need 1.3; 1.5 is the oldest release we
  # support. Validation blocks only reference their own variable (cross-variable
  # validation would need 1.9).
  required_version = ">= 1.5.0, < 2.0.0"

  required_providers {
    aws = {
      source = "hashicorp/aws"
      # 5.x and 6.x: the module avoids arguments that changed between them
      # (no data.aws_region .name/.region, no per-resource region argument).
      version = ">= 5.50.0, < 7.0.0"
    }
  }
}
