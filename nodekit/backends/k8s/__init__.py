"""The job as Kubernetes manifests: plan (validate, decide) and render (pure documents)."""
