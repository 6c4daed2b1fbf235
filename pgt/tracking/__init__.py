"""MLflow: runs and their lineage, the Model Registry's promotion rule."""
