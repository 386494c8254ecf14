"""What the operator tells people: Kubernetes Events, metrics, the engine listener, health."""
