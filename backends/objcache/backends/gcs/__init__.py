"""``gs://``: Google Cloud Storage, through google-cloud-storage.

The folder: ``spec`` (what the registry reads: scheme, options, location check, extra),
``store`` (the backend, ``GCSBackend``, which the registry names), ``errors`` (GCS error
classification). Importing this package or its ``spec`` imports no SDK and no backend code."""
