"""``s3://``: S3 and S3-compatible stores, through aiobotocore.

The folder: ``spec`` (what the registry reads: scheme, options, location check, extra),
``store`` (the backend, ``S3Backend``, which the registry names), ``direct`` (single-part
requests over aiohttp), ``errors`` (S3 error classification). Importing this package or its
``spec`` imports no SDK and no backend code."""
