"""What the operator tells people: Kubernetes Events, metrics, health."""
