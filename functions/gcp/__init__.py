"""Google Cloud Functions (gen2) / Cloud Run functions adapter."""
